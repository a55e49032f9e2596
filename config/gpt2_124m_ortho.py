# GPT-2 small with the feature-wise orthogonal residual update (Oh et al. 2025, arXiv:2505.11881, Sec. 3.2, Alg. 1).
from config.gpt2_124m import *  # noqa: F401,F403

out_dir = 'out-gpt2-124m-ortho'
residual = 'orthogonal'
ortho_mode = 'feature'
