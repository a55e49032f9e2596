# Deep Delta Learning (Y. Zhang, Y. Liu, M. Wang, Q. Gu, "Deep Delta Learning", arXiv:2601.00417): every
# attention and MLP output written into the stream by a rank-1 delta rule, x + beta (v - <k, x>) k, on the
# Orthogonal Transformer paper's pre-RMSNorm baseline.
from config.shakespeare_char import *  # noqa: F401,F403  (the paper's setting)

out_dir = 'out-shakespeare-ddl'
residual = 'ddl'
ddl_beta_init = 1.0
