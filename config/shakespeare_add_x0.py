# The speedruns' stream anchors on the additive baseline: x <- a x + b RMSNorm(x0) before each block, learnable per
# block, from (1, 0) as in modded-nanogpt's record and in the nanochat run that measured them (docs/rules.md;
# x0_mix='nanochat' starts from nanochat's later values).
from config.shakespeare_char import *  # noqa: F401,F403  (the paper's setting)

out_dir = 'out-shakespeare-add-x0'
residual = 'additive'
x0_mix = 'identity'
