# mHC (Sinkhorn) whose mixing starts live: H~_res = I, the logits of lucidrains' `hyper-connections` package
# (0.525 of each copy's mass from the other copies for n = 4, against 1e-3 at config/shakespeare_mhc.py's 8);
# docs/rules.md says what each mhc_res_init means, docs/results.md what it changes.
from config.shakespeare_mhc import *  # noqa: F401,F403

out_dir = 'out-shakespeare-mhc-init1'
mhc_res_init = 1.0
