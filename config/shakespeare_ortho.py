# Orthogonal residual update x + u_perp (Oh et al. 2025, arXiv:2505.11881, Sec. 3.2), feature-wise (Alg. 1).
from config.shakespeare_char import *  # noqa: F401,F403  (the paper's setting)

out_dir = 'out-shakespeare-ortho'
residual = 'orthogonal'
ortho_mode = 'feature'
ortho_eps = 1e-6
ortho_prob = 1.0
