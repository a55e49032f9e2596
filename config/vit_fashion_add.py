# Fashion-MNIST ViT with additive residual connections (the baseline).
from config.vit_fashion import *  # noqa: F401,F403

out_dir = 'out-vit-fashion-add'
residual = 'additive'
