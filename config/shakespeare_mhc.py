# mHC (Z. Xie et al., "mHC: Manifold-Constrained Hyper-Connections", arXiv:2512.24880): Hyper-
# Connections whose stream mixing is doubly stochastic (Sinkhorn-Knopp, 20 rounds) and whose read
# and write weights are non-negative, n = 4 copies, on the Orthogonal Transformer paper's
# pre-RMSNorm baseline.
from config.shakespeare_char import *  # noqa: F401,F403  (the paper's setting)

out_dir = 'out-shakespeare-mhc'
residual = 'mhc'
hc_rate = 4
hc_dynamic = True
mhc_res = 'sinkhorn'
mhc_sinkhorn_iters = 20
mhc_res_init = 1.0  # H_res's logits start at I, a mixing that learns (docs/results.md: mHC's H_res initialisation)
