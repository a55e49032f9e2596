# mHC (Sinkhorn) whose mixing starts near I: H~_res 0 on the diagonal and -8 off it, so each copy takes 1.0e-3
# of its mass from the other copies for n = 4 (against 0.525 at the default 1), and every gradient into H~_res is
# scaled by about e^-8: this codebase's default before docs/results.md's study of mhc_res_init chose 1.
from config.shakespeare_mhc import *  # noqa: F401,F403

out_dir = 'out-shakespeare-mhc-init8'
mhc_res_init = 8.0
