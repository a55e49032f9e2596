# ViT-S on CIFAR-10, linear (additive) residual connections: the "Linear" row of Oh et al. 2025, arXiv:2505.11881.
from config.vit_cifar10 import *  # noqa: F401,F403

out_dir = 'out-vit-cifar10-add'
residual = 'additive'
