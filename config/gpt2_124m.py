# GPT-2 small (124M) on a prepared corpus, with nanoGPT's train_gpt2.py recipe:
#   python data/prepare_text.py --dataset openwebtext        # or fineweb-edu, or --files ... --name X
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2_124m_add.py --init_from=auto
# 12 layers, 768 wide, 12 heads, block 1024. A step is 12 sequences x 1024 tokens x 40 micro-steps
# = 491,520 tokens (~0.5M), on any number of GPUs dividing 40; on one GPU it takes 40 micro-steps.
# gpt2_124m_{add,ortho,rot}.py import this and choose the residual rule.

dataset = 'openwebtext'
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
vocab_size = 50304  # GPT-2's 50257, padded to a multiple of 64
dropout = 0.0
bias = False

batch_size = 12
gradient_accumulation_steps = 40
learning_rate = 6e-4
min_lr_ratio = 0.1
max_iters = 600000
warmup_iters = 2000
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

eval_interval = 1000
eval_iters = 200
log_interval = 10
