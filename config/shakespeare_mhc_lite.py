# mHC-lite (Y. Yang, J. Gao, "mHC-lite: You Don't Need 20 Sinkhorn-Knopp Iterations", arXiv:2601.05732):
# mHC whose stream mixing is an exact convex combination of the n! permutation matrices (doubly
# stochastic with no iterations), n = 4 copies, on the Orthogonal Transformer paper's baseline.
from config.shakespeare_mhc import *  # noqa: F401,F403

out_dir = 'out-shakespeare-mhc-lite'
mhc_res = 'permutation'
