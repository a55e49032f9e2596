# GPT-2 small with the standard additive residual (pre-LayerNorm, GELU, tied head): nanoGPT's baseline.
from config.gpt2_124m import *  # noqa: F401,F403

out_dir = 'out-gpt2-124m-add'
residual = 'additive'
