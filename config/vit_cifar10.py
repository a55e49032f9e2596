# ViT-S on CIFAR-10 with the recipe of Oh et al. 2025, arXiv:2505.11881 (App. A.1, Table 5), one GPU:
#   python train.py config/vit_cifar10_add.py        # or _ortho
# 6 layers, 384 wide, 6 heads, patch 4 (8 x 8 patches + [CLS]), 300 epochs of 48 steps at batch
# 1024, AdamW lr 1e-3 betas (0.9, 0.999) weight decay 1e-4, cosine with 10 warmup epochs,
# random crop (pad 4), horizontal flip, mixup 0.8 / cutmix 1.0, label smoothing 0.1, random
# erasing 0.25. Not implemented here, so left out: the paper's colour jitter and RandAugment (9, 5).
# Not given by the paper: a floor of lr/100 (DeiT's 1e-5), no gradient clipping, no dropout.
dataset = 'cifar10'
n_layer = 6
n_head = 6
n_embd = 384
patch_size = 4
bias = True
norm = 'layernorm'
activation = 'gelu'
dropout = 0.0
label_smoothing = 0.1

batch_size = 1024
gradient_accumulation_steps = 1
learning_rate = 1e-3
min_lr_ratio = 0.01
beta1 = 0.9
beta2 = 0.999
weight_decay = 1e-4
grad_clip = 0.0
max_iters = 14_640  # 300 epochs of 50,000 // 1024 = 48 steps
warmup_iters = 480  # 10 epochs

crop_padding = 4
hflip = True
mixup_alpha = 0.8
cutmix_alpha = 1.0
mix_prob = 1.0
mix_switch_prob = 0.5
erase_prob = 0.25

eval_interval = 480
log_interval = 48
