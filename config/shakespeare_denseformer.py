# DenseFormer (M. Pagliardini, A. Mohtashami, F. Fleuret, M. Jaggi, arXiv:2402.02622): after each block a learned
# weighted average of the embeddings and every earlier block's output, on the Orthogonal Transformer paper's
# pre-RMSNorm baseline.
from config.shakespeare_char import *  # noqa: F401,F403  (the paper's setting)

out_dir = 'out-shakespeare-denseformer'
residual = 'denseformer'
