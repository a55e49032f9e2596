# The normalized Transformer: I. Loshchilov, C.-P. Hsieh, S. Sun, B. Ginsburg, "nGPT: Normalized
# Transformer with Representation Learning on the Hypersphere", ICLR 2025, arXiv:2410.01131. Its
# stream, embeddings and matrices live on the unit sphere; no norms, no weight decay, no warmup
# (its Sec. 2.6). Positions are this codebase's learned embeddings, not the paper's RoPE.
from config.shakespeare_char import *  # noqa: F401,F403  (the Orthogonal Transformer paper's setting)

out_dir = 'out-shakespeare-ngpt'
residual = 'ngpt'
mlp = 'gated'  # the paper's MLP (Sec. 2.4.2, Table 2): u * SiLU(v) with s_u, s_v, 4 x n_embd wide
mlp_ratio = 4.0
weight_decay = 0.0
warmup_iters = 0
