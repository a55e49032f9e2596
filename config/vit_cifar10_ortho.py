# ViT-S on CIFAR-10 with feature-wise orthogonal residual updates: the "Orthogonal-F" row of Oh et al. 2025, arXiv:2505.11881.
from config.vit_cifar10 import *  # noqa: F401,F403

out_dir = 'out-vit-cifar10-ortho'
residual = 'orthogonal'
ortho_mode = 'feature'
