# Fashion-MNIST ViT with Q, K, V orthogonal through the matrix exponential (O-ViT's Exp-ViT comparison,
# Fei et al. 2022, arXiv:2201.12133, Sec. 3.2), on additive residuals.
from config.vit_fashion import *  # noqa: F401,F403

out_dir = 'out-vit-fashion-exp'
residual = 'additive'
qkv = 'exp'
