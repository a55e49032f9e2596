# Attention Residuals (Kimi Team, "Attention Residuals", arXiv:2603.15031): each sublayer reads a softmax mixture
# over depth of the embeddings and every earlier sublayer's output, in place of a residual stream (full AttnRes),
# on the Orthogonal Transformer paper's pre-RMSNorm baseline.
from config.shakespeare_char import *  # noqa: F401,F403  (the paper's setting)

out_dir = 'out-shakespeare-attnres'
residual = 'attnres'
attnres_block = 1
