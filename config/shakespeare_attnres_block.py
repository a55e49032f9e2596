# Block Attention Residuals (Kimi Team, arXiv:2603.15031, Sec. 3.2): the sources are the embeddings and the sums of
# blocks of 4 sublayers (two transformer blocks), 8 blocks at this 16-layer depth, where the paper finds that about 8
# recover most of full AttnRes's gain.
from config.shakespeare_attnres import *  # noqa: F401,F403

out_dir = 'out-shakespeare-attnres-block'
attnres_block = 4
