# O-ViT's orthogonal attention projections on the additive baseline: Q, K and V weights are
# Cayley maps 2(I + A)^-1 - I of skew-symmetric A = W - W^T (Fei et al. 2022, arXiv:2201.12133, Sec. 3.2).
from config.shakespeare_char import *  # noqa: F401,F403  (the paper's setting)

out_dir = 'out-shakespeare-cayley'
residual = 'additive'
qkv = 'cayley'
