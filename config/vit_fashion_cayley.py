# Fashion-MNIST ViT with O-ViT's Cayley-orthogonal Q, K, V on additive residuals (Fei et al. 2022, arXiv:2201.12133).
from config.vit_fashion import *  # noqa: F401,F403

out_dir = 'out-vit-fashion-cayley'
residual = 'additive'
qkv = 'cayley'
