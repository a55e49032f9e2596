# A small ViT for Fashion-MNIST that trains on a 2-core CPU in minutes (patch 4 on 28 x 28: 7 x 7
# patches + [CLS]). vit_fashion_{add,ortho,rot,cayley}.py import this and pick the update rule.
#   apt-get install dataset-fashion-mnist     # or --image_dir=DIR, or Hugging Face access
#   python train.py config/vit_fashion_add.py
dataset = 'fashion_mnist'
device = 'cpu'
compile = False

n_layer = 4
n_head = 4
n_embd = 96
patch_size = 4
bias = True
norm = 'layernorm'
activation = 'gelu'
dropout = 0.0
label_smoothing = 0.1

batch_size = 128
learning_rate = 2e-3
min_lr = 2e-5
beta1 = 0.9
beta2 = 0.999
weight_decay = 0.05
grad_clip = 1.0
max_iters = 4000
warmup_iters = 200

crop_padding = 2
hflip = True

eval_interval = 500
log_interval = 50
