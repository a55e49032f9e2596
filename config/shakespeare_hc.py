# Hyper-Connections (D. Zhu et al., "Hyper-Connections", ICLR 2025, arXiv:2409.19606): the stream as
# n = 4 copies, mixed around every attention and MLP by weights predicted from the stream (DHC, the
# paper's default), on the Orthogonal Transformer paper's pre-RMSNorm baseline.
from config.shakespeare_char import *  # noqa: F401,F403  (the paper's setting)

out_dir = 'out-shakespeare-hc'
residual = 'hc'
hc_rate = 4
hc_dynamic = True
