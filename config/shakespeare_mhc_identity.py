# The identity ablation of mHC: the copies read and written as mHC does, never mixed (H_res = I),
# n = 4 copies, on the Orthogonal Transformer paper's baseline.
from config.shakespeare_mhc import *  # noqa: F401,F403

out_dir = 'out-shakespeare-mhc-identity'
mhc_res = 'identity'
