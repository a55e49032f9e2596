"""The typed config loader: stacking, overrides, and the errors users see."""

import glob
import json
import math
import os
from dataclasses import asdict, fields

import pytest

import configure
from model import RESIDUALS
from orthogpt.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


def cfgfile(name):
    return os.path.join(ROOT, 'config', name)


def write(tmp_path, text, name='c.py'):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_files_stack_left_to_right_and_overrides_win():
    cfg = configure.load([cfgfile('shakespeare_rot.py'), cfgfile('cpu.py'), '--max_iters=300'])
    assert (cfg.residual, cfg.init, cfg.activation, cfg.n_layer, cfg.n_embd) == ('rotation', 'sigma', 'relu', 4, 128)
    assert (cfg.block_size, cfg.batch_size, cfg.eval_iters) == (64, 12, 20)
    assert cfg.max_iters == 300
    assert cfg.out_dir == 'out-shakespeare-rot-cpu'  # cpu.py reads the value the file before it set


def test_cpu_recipe_takes_the_rates_tuned_for_the_rule_and_mlp_before_it():
    def load(*argv):
        return configure.load([*argv, cfgfile('cpu.py')])
    assert load(cfgfile('shakespeare_ngpt.py')).learning_rate == 8e-3
    assert load(cfgfile('shakespeare_ortho.py')).learning_rate == 4e-3
    assert load(cfgfile('shakespeare_ortho.py'), '--mlp=gated').learning_rate == 2e-3
    assert load(cfgfile('shakespeare_cayley.py')).learning_rate == 1e-3  # not tuned: nanoGPT's CPU rate
    assert load(cfgfile('shakespeare_attnres.py')).learning_rate == 1e-3
    assert load(cfgfile('shakespeare_attnres_block.py')).learning_rate == 2e-3  # in blocks: a rate of its own
    assert load(cfgfile('shakespeare_attnres_block.py'), '--mlp=gated').learning_rate == 1e-3
    assert load(cfgfile('shakespeare_denseformer.py')).learning_rate == 4e-3
    assert load(cfgfile('vit_fashion_add.py')).learning_rate == 1e-3
    muon = load(cfgfile('shakespeare_add.py'), cfgfile('muon.py'))
    assert (muon.learning_rate, muon.muon_lr, muon.muon_weight_decay) == (2e-3, 0.01, 0.1)
    muon = load(cfgfile('shakespeare_ngpt.py'), cfgfile('muon.py'))
    assert (muon.learning_rate, muon.muon_lr, muon.muon_weight_decay) == (8e-3, 0.02, 0.1)


def test_later_file_overrides_earlier_override(tmp_path):
    cfg = configure.load(['--n_layer=6', write(tmp_path, 'n_layer = 3\n')])
    assert cfg.n_layer == 3


@pytest.mark.parametrize('path', sorted(p for p in glob.glob(os.path.join(ROOT, 'config', '*.py'))
                                         if not p.endswith('__init__.py')), ids=os.path.basename)
def test_every_config_file_loads(path):
    if path.endswith('cpu.py'):
        cfg = configure.load([path])
    else:
        cfg = configure.load([path, cfgfile('cpu.py')])
    assert cfg.n_layer == 4


def test_shakespeare_variants_differ_only_in_their_rule():
    a, o, r, c = (asdict(configure.load([cfgfile(f'shakespeare_{v}.py')])) for v in ('add', 'ortho', 'rot', 'cayley'))
    diff = lambda x: {k for k in a if a[k] != x[k]}  # noqa: E731
    assert diff(o) == {'out_dir', 'residual', 'options'}  # the orthogonal rule's options come with it
    assert diff(r) == {'out_dir', 'residual'}
    assert diff(c) == {'out_dir', 'qkv'}
    assert (a['n_layer'], a['n_embd'], a['n_head'], a['learning_rate'], a['beta2']) == (16, 256, 4, 1e-3, 0.99)


@pytest.mark.parametrize('arg,expected', [
    ('--n_layers=4', "did you mean 'n_layer'"),
    ('--learing_rate=1e-3', "did you mean 'learning_rate'"),
    ('--n_layer=four', 'n_layer expects int'),
    ('--n_layer=4.5', 'n_layer expects int'),
    ('--compile=maybe', 'compile expects bool'),
    ('--residual=rotaton', "did you mean 'rotation'"),
    ('--ortho_layers=a,b', 'tuple of int'),
    ('--n_layer', 'has no value'),
    ('n_layer=4', 'did you mean --n_layer=4'),
    ('--n_embd=100', 'not divisible by n_head'),
    ('--dropout=1.5', 'dropout=1.5 must lie in'),
    ('--batch_size=0', 'batch_size=0 must be at least 1'),
    ('--n_head=0', 'n_head=0 must be at least 1'),
    ('--learning_rate=nan', 'learning_rate=nan must be a finite number'),
    ('--beta2=1.0', r'beta2=1.0 must lie in \[0, 1\)'),
    ('--min_lr_ratio=1.5', r'min_lr_ratio=1.5 must lie in \[0, 1\]'),
    ('--residual=orthogonal --ortho_eps=-1e-6', 'ortho_eps=-1e-06 must not be negative'),  # the rule's own check
])
def test_bad_overrides(arg, expected):
    with pytest.raises(UserError, match=expected):
        configure.load(arg.split(' '))


def test_override_types():
    cfg = configure.load(['--dropout=0', '--compile=False', '--ortho_layers=0,1', '--wandb_run_name=None',
                          '--out_dir=out x', '--min_lr_ratio=0', '--sigma_w=1', '--residual=orthogonal'])
    assert cfg.dropout == 0.0 and isinstance(cfg.dropout, float)
    assert cfg.compile is False and cfg.options.ortho_layers == (0, 1) and cfg.wandb_run_name is None
    assert cfg.out_dir == 'out x' and cfg.min_lr_ratio == 0.0 and cfg.sigma_w == 1.0
    assert configure.load(['--residual=orthogonal', '--ortho_layers=None']).options.ortho_layers is None


def test_unknown_key_in_file_names_file_and_closest_key(tmp_path):
    path = write(tmp_path, 'n_embed = 64\n')
    with pytest.raises(UserError, match=r"unknown config key 'n_embed' in .*c\.py; did you mean 'n_embd'"):
        configure.load([path])


def test_wrong_type_in_file(tmp_path):
    with pytest.raises(UserError, match=r"c\.py: n_layer expects int, got str '4'"):
        configure.load([write(tmp_path, "n_layer = '4'\n")])


def test_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "n_layer = 4\nn_head = = 2\n")
    with pytest.raises(UserError, match=r"c\.py:2: syntax error"):
        configure.load([path])


def test_runtime_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "n_layer = 4\n\nn_head = undefined_name\n")
    with pytest.raises(UserError, match=r"c\.py:3: NameError"):
        configure.load([path])


def test_missing_file_suggests_neighbour():
    with pytest.raises(UserError, match=r"not found; did you mean '.*shakespeare_rot\.py'"):
        configure.load([cfgfile('shakespeare_rott.py')])


def test_private_names_and_imports_are_allowed(tmp_path):
    cfg = configure.load([write(tmp_path, "import math\n_width = 2 ** 5\nn_embd = _width * 2\nn_head = 4\n")])
    assert cfg.n_embd == 64


def test_round_trip_through_json():
    cfg = configure.load([cfgfile('shakespeare_ortho.py'), '--ortho_layers=1,3'])
    again = configure.from_dict(json.loads(json.dumps(asdict(cfg))))
    assert again == cfg and again.options.ortho_layers == (1, 3)


def test_usage_lists_every_key_with_its_default_description_and_type():
    lines = {line.split('=')[0].strip(): line for line in configure.usage().splitlines() if line.startswith('  ')}
    defaults = {f.name: f.default for f in fields(configure.Config) if f.name != 'options'}
    options = {f.name for rule in RESIDUALS.values() for f in fields(rule.Options)}  # each rule's own keys
    assert options >= {'ortho_mode', 'ortho_eps', 'ortho_prob', 'ortho_layers', 'hc_rate'}
    assert set(defaults) | options == set(lines)
    for key, default in defaults.items():
        described = lines[key].split(f"{key}={default!r} ")[1].rsplit(' [', 1)[0].strip()
        assert len(described) > 5, lines[key]  # a comment of its own, from the schema
    assert "'additive' | 'orthogonal' | 'rotation'" in lines['residual']  # read from model.RESIDUALS
    assert "'feature' | 'global'" in lines['ortho_mode'] and '[int]' in lines['n_layer']
    assert 'Alg. 1' in lines['ortho_mode']  # the rule's own comment


def test_a_rule_written_for_the_protocol_before_sublayer_is_refused_with_the_fix(registered):
    """prepare(x, cache) -> (h, state) and forward(x, u, cache | state | depth): one line that names the new form."""
    import model

    class Old(model.ResidualUpdate):
        def forward(self, x, u, cache=None):
            return x + u

    class Wide(model.ResidualUpdate):
        def prepare(self, x, cache=None, depth=None):
            return x, None

        def forward(self, x, u, state):
            return x + u
    for name, cls, names in (('old', Old, 'cache'), ('old_wide', Wide, 'cache, depth, state')):
        registered(name, cls)
        with pytest.raises(UserError, match=rf"^residual='{name}' \(module [\w.]*test_config\) takes {names} in "
                                            rf"prepare or "
                                            rf"forward, the rule protocol before Sublayer; they now take one context: "
                                            rf"prepare\(x, sub\) -> h and forward\(x, u, sub\)"):
            configure.load([f'--residual={name}'])


def test_a_rule_declares_its_options(registered):
    """A rule's Options: the config accepts its keys (typed), --help lists them, the model reads them,
    and they are the chosen rule's alone."""
    from dataclasses import dataclass

    import model

    class Gated(model.AdditiveUpdate):
        @dataclass
        class Options:
            gate_init: float = 0.5  # the gate's starting value

        @classmethod
        def from_config(cls, cfg, layer, causal):
            return cls()
    registered('gated', Gated)
    cfg = configure.load(['--residual=gated', '--gate_init=2'])
    assert cfg.options == Gated.Options(gate_init=2.0)
    assert 'gate_init' in configure.usage() and "the gate's starting value" in configure.usage()
    with pytest.raises(UserError, match='gate_init expects float'):
        configure.load(['--residual=gated', '--gate_init=high'])
    other = configure.load(['--residual=additive', '--gate_init=2'])  # checked, but not the additive rule's
    assert other.options == model.AdditiveUpdate.Options()


def test_the_model_kind_follows_the_dataset_unless_given():
    assert configure.load([]).model == 'gpt'
    assert configure.load(['--dataset=cifar10']).model == 'vit'
    assert configure.load(['--dataset=mydata', '--model=vit']).model == 'vit'


def test_a_vit_takes_the_sigma_init_a_tied_gpt_refuses():
    """Each model's own checks: tie_weights concerns the GPT's head, not a ViT's."""
    cfg = configure.load([cfgfile('vit_fashion_add.py'), '--init=sigma'])
    assert (cfg.model, cfg.init, cfg.tie_weights) == ('vit', 'sigma', True)
    with pytest.raises(UserError, match="init='sigma' needs tie_weights=False"):
        configure.load(['--init=sigma'])


def test_depth_sets_the_documented_shapes_rate_and_budget():
    """nanochat's one knob: n_layer = n_head = depth, n_embd = aspect x depth; AdamW's rate, set for the width
    before depth, scaled by sqrt(that width / n_embd); max_iters for tokens_per_param tokens per block parameter."""
    base = configure.load([cfgfile('shakespeare_add.py'), cfgfile('cpu.py')])  # 4 x 128, learning_rate 2e-3
    cfg = configure.load([cfgfile('shakespeare_add.py'), cfgfile('cpu.py'), '--depth=3', '--aspect=32',
                          '--tokens_per_param=2'])
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd) == (3, 3, 96)
    assert cfg.learning_rate == pytest.approx(base.learning_rate * math.sqrt(128 / 96))
    blocks = 3 * (12 * 96 ** 2 + 2 * 96)  # c_attn, c_proj, c_fc, c_proj (no biases) and two RMSNorm gains
    assert configure.schema.block_parameters(cfg) == blocks
    assert cfg.max_iters == math.ceil(2 * blocks / (12 * 64))  # batch_size x block_size tokens a step
    off = configure.load([cfgfile('shakespeare_add.py'), cfgfile('cpu.py'), '--depth=3', '--tokens_per_param=0'])
    assert off.max_iters == base.max_iters and off.n_embd == 192


def test_keys_set_after_depth_override_it_and_those_before_do_not():
    cfg = configure.load([cfgfile('shakespeare_add.py'), '--n_layer=9', '--depth=2', '--n_head=1', '--max_iters=7',
                          '--learning_rate=1e-3'])
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.max_iters, cfg.learning_rate) == (2, 1, 128, 7, 1e-3)
    assert configure.load([cfgfile('shakespeare_add.py'), '--depth=2']).n_embd == 128
    assert configure.load([cfgfile('shakespeare_add.py')]).depth == 0  # off by default: the file's shapes


@pytest.mark.parametrize('argv, key, model', [(['shakespeare_add.py', '--patch_size=2'], 'patch_size', 'vit'),
                                              (['vit_fashion.py', '--block_size=32'], 'block_size', 'gpt')])
def test_a_run_refuses_the_other_models_keys(argv, key, model):
    with pytest.raises(UserError, match=f"{key}: a key of model='{model}'.*remove it"):
        configure.load([cfgfile(argv[0]), argv[1]])


def test_a_saved_config_holds_the_other_models_keys_at_their_defaults_and_loads():
    cfg = configure.load([cfgfile('vit_fashion.py'), cfgfile('cpu.py')])
    assert configure.from_dict(json.loads(json.dumps(asdict(cfg)))) == cfg
    changed = {**asdict(cfg), 'block_size': 32}
    with pytest.raises(UserError, match="block_size: a key of model='gpt'"):
        configure.from_dict(changed)


def test_two_rules_that_declare_one_option_otherwise_are_refused_at_registration(registered):
    """One key is one config key whichever rule reads it: another rule may share it only with its type and default
    (as mHC shares HC's), and the error names both rules."""
    from dataclasses import dataclass

    from model import OrthogonalUpdate, ResidualUpdate

    @dataclass
    class Same:
        ortho_eps: float = 1e-6  # OrthogonalUpdate's, as it declares it

    registered('same_eps', type('SameEps', (ResidualUpdate,), {'Options': Same}))
    for default, kind in ((1e-3, float), (1e-6, int)):
        other = dataclass(type('Other', (), {'__annotations__': {'ortho_eps': kind}, 'ortho_eps': default}))
        with pytest.raises(ValueError, match=r"residual='clash' and residual='orthogonal' declare one option "
                                             r"otherwise \(ortho_eps: .*\); give 'clash''s keys a prefix of its own"):
            registered('clash', type('Clash', (OrthogonalUpdate,), {'Options': other}))
    assert 'clash' not in configure.loader.RESIDUALS
