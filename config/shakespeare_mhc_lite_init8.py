# mHC-lite (permutations) whose mixing starts near I as mHC-lite's code does: logit 0 for the identity
# permutation and -8 for the other 23, so 6.0e-3 of each copy's mass from the other copies for n = 4 (against
# 0.70 at the default 1); docs/rules.md says what each mhc_res_init means, docs/results.md what it changes.
from config.shakespeare_mhc_lite import *  # noqa: F401,F403

out_dir = 'out-shakespeare-mhc-lite-init8'
mhc_res_init = 8.0
