# mHC-lite (permutations) whose mixing starts live: logit 0 for the identity permutation and -1 for the other
# 23, so 0.70 of each copy's mass from the other copies for n = 4 (against 6e-3 at config/shakespeare_mhc_lite.py's
# 8); docs/rules.md says what each mhc_res_init means, docs/results.md what it changes.
from config.shakespeare_mhc_lite import *  # noqa: F401,F403

out_dir = 'out-shakespeare-mhc-lite-init1'
mhc_res_init = 1.0
