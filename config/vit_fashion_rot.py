# Fashion-MNIST ViT as an Orthogonal Transformer: rotation updates, no norms in the blocks.
from config.vit_fashion import *  # noqa: F401,F403

out_dir = 'out-vit-fashion-rot'
residual = 'rotation'
