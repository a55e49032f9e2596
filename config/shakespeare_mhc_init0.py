# mHC (Sinkhorn) whose mixing starts uniform: H~_res = 0, H_res = J/n (each copy takes 1 - 1/n of its mass
# from the others); docs/rules.md says what each mhc_res_init means, docs/results.md what it changes.
from config.shakespeare_mhc import *  # noqa: F401,F403

out_dir = 'out-shakespeare-mhc-init0'
mhc_res_init = 0.0
