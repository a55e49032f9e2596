# Shrinks any config to nanoGPT's CPU recipe (its README, "I only have a macbook"):
#   python train.py config/shakespeare_rot.py config/cpu.py
# Stack it last; it keeps the residual rule, init and optimiser of the file before it, and sets the
# rates tuned for that rule and MLP at this recipe (docs/results.md, "Residual rules at the CPU
# recipe": each tuned on seed 1337 for the final val loss). It reads the settings made before it,
# so put overrides of residual, mlp or optimizer before it: ... --mlp=gated config/cpu.py
# A series of sizes: --depth=D after it (python train.py --help: depth, aspect, tokens_per_param),
# as tools/miniseries.py runs it.
from configure.schema import IMAGE_DATASETS as _IMAGE_DATASETS

device = 'cpu'
compile = False
n_layer = 4
n_head = 4
n_embd = 128
if dataset not in _IMAGE_DATASETS:  # noqa: F821  (a ViT's context is its patches)
    block_size = 64
batch_size = 12
max_iters = 2000
min_lr_ratio = 0.1
dropout = 0.0
eval_iters = 20
out_dir = out_dir + '-cpu'  # noqa: F821  (set by the config before this one)

# AdamW's learning_rate for the standard and the gated MLP. The gated column was tuned at the
# standard MLP's parameter count (mlp_ratio=None); nGPT's config, 4 x n_embd wide, takes it too.
_adamw = {
    'additive': {'standard': 2e-3, 'gated': 2e-3},
    'orthogonal': {'standard': 4e-3, 'gated': 2e-3},
    'rotation': {'standard': 2e-3, 'gated': 2e-3},
    'ngpt': {'standard': 8e-3, 'gated': 8e-3},
    'hc': {'standard': 2e-3, 'gated': 2e-3},  # tuned with the standard MLP; the gated one takes its rate
    'mhc': {'standard': 2e-3, 'gated': 2e-3},
    # tuned with the standard MLP alone (docs/results.md, "Rules that look across depth"); the gated one takes 1e-3
    'ddl': {'standard': 2e-3},
    'attnres': {'standard': 1e-3},  # in blocks (attnres_block > 1), 2e-3: below
    'denseformer': {'standard': 4e-3},
}
# Under Muon (config/muon.py), (muon_lr, muon_weight_decay) for the blocks' matrices; the rest
# keeps AdamW's rate above.
_muon = {
    'additive': {'standard': (0.01, 0.1), 'gated': (0.01, 0.1)},
    'orthogonal': {'standard': (0.01, 0.0), 'gated': (0.01, 0.1)},
    'rotation': {'standard': (0.01, 0.1), 'gated': (0.01, 0.0)},
    'ngpt': {'standard': (0.01, 0.1), 'gated': (0.02, 0.1)},
}
# These were tuned in GPT-2's block (config/shakespeare_char.py). Other datasets, Q/K/V maps, rules and blocks
# (config/modern.py's) were not tuned here: nanoGPT's CPU rate.
_gpt2_block = (pos, qk_norm, norm_gain, value_embeds, logit_softcap) == ('learned', False, True, False, 0.0)  # noqa: F821
_tuned = dataset == 'shakespeare_char' and qkv == 'dense' and _gpt2_block  # noqa: F821
_rates = _adamw.get(residual, {}) if _tuned else {}  # noqa: F821
learning_rate = _rates.get(mlp, 1e-3)  # noqa: F821
if _tuned and residual == 'attnres' and attnres_block > 1 and mlp == 'standard':  # noqa: F821
    learning_rate = 2e-3
if optimizer == 'muon' and _tuned and mlp in _muon.get(residual, {}):  # noqa: F821
    muon_lr, muon_weight_decay = _muon[residual][mlp]  # noqa: F821
