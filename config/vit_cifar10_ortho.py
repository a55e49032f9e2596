# ViT-S on CIFAR-10 with feature-wise orthogonal residual updates: Oh et al.'s "Orthogonal-F" row.
from config.vit_cifar10 import *  # noqa: F401,F403

out_dir = 'out-vit-cifar10-ortho'
residual = 'orthogonal'
ortho_mode = 'feature'
