# Baseline: pre-RMSNorm transformer with additive residual updates, x + u.
from config.shakespeare_char import *  # noqa: F401,F403  (the paper's setting)

out_dir = 'out-shakespeare-add'
residual = 'additive'
