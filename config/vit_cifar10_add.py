# ViT-S on CIFAR-10, linear (additive) residual connections: Oh et al.'s "Linear" row.
from config.vit_cifar10 import *  # noqa: F401,F403

out_dir = 'out-vit-cifar10-add'
residual = 'additive'
