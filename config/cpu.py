# Shrinks any config to nanoGPT's CPU recipe (its README, "I only have a macbook"):
#   python train.py config/shakespeare_rot.py config/cpu.py
# Stack it last; it keeps the residual rule, init and optimiser of the file before it.
device = 'cpu'
compile = False
n_layer = 4
n_head = 4
n_embd = 128
block_size = 64
batch_size = 12
max_iters = 2000
learning_rate = 1e-3
min_lr_ratio = 0.1
dropout = 0.0
eval_iters = 20
out_dir = out_dir + '-cpu'  # noqa: F821  (set by the config before this one)
