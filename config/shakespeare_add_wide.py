# The additive baseline under a name of its own, for a comparison with two additive rows: one at the
# recipe's width and one widened to another rule's parameter count, e.g. mHC's in docs/results.md:
#   python tools/compare.py config/shakespeare_add.py config/shakespeare_add_wide.py ... \
#       --stack=config/cpu.py --per shakespeare_add_wide:n_embd=136
from config.shakespeare_add import *  # noqa: F401,F403

out_dir = 'out-shakespeare-add-wide'
