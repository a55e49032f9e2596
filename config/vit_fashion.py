# A small ViT for Fashion-MNIST, sized for a CPU (patch 4 on 28 x 28: 7 x 7 patches + [CLS]; 4 layers x 64).
# vit_fashion_{add,ortho,rot,cayley,exp}.py import this and pick the update rule.
#   apt-get install dataset-fashion-mnist     # or --image_dir=DIR, or Hugging Face access
#   python train.py config/vit_fashion_add.py
dataset = 'fashion_mnist'
device = 'cpu'
compile = False

n_layer = 4
n_head = 4
n_embd = 64
patch_size = 4
bias = True
norm = 'layernorm'
activation = 'gelu'
dropout = 0.0
label_smoothing = 0.1

# ~5.5 epochs: with few epochs the model underfits, so no crops, mixup or erasing; flips only
batch_size = 128
learning_rate = 3e-3
min_lr_ratio = 0.01
beta1 = 0.9
beta2 = 0.999
weight_decay = 0.05
grad_clip = 1.0
max_iters = 2600
warmup_iters = 200

crop_padding = 0
hflip = True

eval_interval = 650
log_interval = 50
