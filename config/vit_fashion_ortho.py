# Fashion-MNIST ViT with feature-wise orthogonal residual updates (Oh et al. 2025, arXiv:2505.11881, Alg. 1).
from config.vit_fashion import *  # noqa: F401,F403

out_dir = 'out-vit-fashion-ortho'
residual = 'orthogonal'
ortho_mode = 'feature'
