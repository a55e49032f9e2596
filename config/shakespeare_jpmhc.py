# JPmHC's orthogonal mixer (B. Sengupta, J. Wang, L. Brunswic, "JPmHC: Dynamical Isometry via
# Orthogonal Hyper-Connections", arXiv:2602.18308): mHC whose stream mixing is orthogonal, the Cayley
# transform of a skew matrix predicted from the stream; mHC's read and write kept (model.py says
# where this differs from the paper), n = 4 copies, on the Orthogonal Transformer paper's baseline.
from config.shakespeare_mhc import *  # noqa: F401,F403

out_dir = 'out-shakespeare-jpmhc'
mhc_res = 'cayley'
