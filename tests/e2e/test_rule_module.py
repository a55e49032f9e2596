"""A rule of one's own, in one's own module (here a temporary folder's my_rules.py), works end to end with no project
file edited: `--rule_module=my_rules` trains it, the run records the module, and every reader imports it again by
itself: resume, sample.py, the export (whose folder carries it, and which transformers loads with equal logits),
compare.py and the ablation tool. One-stream, wide and depth rules alike; a reader that cannot import it says so."""

import json
import sys
import textwrap

import pytest
import torch

import sample
from model import GPT, RESIDUALS, GPTConfig
from orthogpt import checkpoint, hf
from tools import compare

MY_RULES = '''
"""A user's rules, outside model.py."""
import torch

from model import DenseFormerUpdate, ResidualUpdate, register


@register('halfway')
class Halfway(ResidualUpdate):
    """x + u / 2: one stream."""

    def forward(self, x, u, sub=None):
        return x + u / 2


@register('twins')
class Twins(ResidualUpdate):
    """Two copies of the stream: a branch reads their mean and writes into the copy layer mod 2."""

    def __init__(self, layer):
        super().__init__()
        self.register_buffer('into', torch.tensor([[1.0], [0.0]]).roll(layer % 2, 0), persistent=False)

    @classmethod
    def from_config(cls, cfg, layer, causal):
        return cls(layer)

    @classmethod
    def copies(cls, cfg):
        return 2

    def prepare(self, x, sub):
        return x.mean(-2)

    def forward(self, x, u, sub):
        return x + self.into * u.unsqueeze(-2)


@register('dense_half')
class DenseHalf(DenseFormerUpdate):
    """DenseFormer's averaging over depth, each branch written in at half its size: a depth rule."""

    def forward(self, x, u, sub):
        return super().forward(x, u / 2, sub)
'''
RULES = ('halfway', 'twins', 'dense_half')


@pytest.fixture
def my_rules(tmp_path, monkeypatch):
    """The folder of my_rules.py, on the path of this process and of those it starts; forget() unregisters its
    rules and unimports it, as a fresh process knows nothing of them."""
    folder = tmp_path / 'mine'
    folder.mkdir()
    (folder / 'my_rules.py').write_text(textwrap.dedent(MY_RULES))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv('PYTHONPATH', str(folder))

    def forget():
        for name in RULES:
            RESIDUALS.pop(name, None)
        sys.modules.pop('my_rules', None)
    yield folder, forget
    forget()


@pytest.mark.parametrize('rule', RULES)
def test_it_trains_resumes_samples_and_exports_where_the_reader_imports_its_module(rule, run, logs, my_rules, capsys,
                                                                                   tmp_path, one_thread):
    transformers = pytest.importorskip('transformers')
    folder, forget = my_rules
    out = run('--rule_module=my_rules', f'--residual={rule}', '--max_iters=10', '--eval_interval=5')
    assert json.loads((out / 'config.json').read_text())['rule_module'] == 'my_rules'
    forget()
    with pytest.raises(SystemExit, match=f"residual='{rule}' is not one of .*; a rule of your own: name its module"):
        run(f'--residual={rule}', '--max_iters=15', '--init_from=resume')
    run('--rule_module=my_rules', f'--residual={rule}', '--max_iters=15', '--eval_interval=5', '--init_from=resume')
    assert [i for i, _ in logs.evals(out)] == [0, 5, 10, 15]
    forget()
    capsys.readouterr()
    sample.main([f'--out_dir={out}', '--start=ROMEO:', '--num_samples=1', '--max_new_tokens=8'])
    assert capsys.readouterr().out.startswith('ROMEO:')
    model = checkpoint.load_language_model(out)[0]
    assert hf.export(model, tmp_path / 'hf') == 'orthogpt'
    assert 'from .model import' in (tmp_path / 'hf' / 'rules.py').read_text()
    forget()  # transformers builds it from the folder alone, its copy of the rule registered in its copy of model.py
    hf.export(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=11)), tmp_path / 'other' / 'hf')
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'other' / 'hf', trust_remote_code=True)  # loaded
    # first, of one name, in this process: transformers keeps each folder's classes apart still
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'hf', trust_remote_code=True)
    idx = torch.randint(model.config.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, model(idx)[0], rtol=0, atol=1e-5)
    assert rule not in RESIDUALS  # the folder's copy registered there, not here
    again = hf.from_pretrained(str(tmp_path / 'hf')).eval()  # OrthoGPT reads it back, importing my_rules by name
    with torch.no_grad():
        torch.testing.assert_close(again(idx)[0], model(idx)[0], rtol=0, atol=0)


def test_compare_and_the_ablation_tool_read_it(run, my_rules, char_data, tiny, tmp_path, capsys, tables):
    from tools import ablate
    folder, forget = my_rules
    out = tmp_path / 'cmp'
    compare.main(['config/shakespeare_add.py', *tiny, f'--data_dir={char_data}', '--rule_module=my_rules',
                  '--set', 'residual=additive,dense_half', '--seeds=1', '--max_iters=4', '--eval_interval=2',
                  f'--out={out}', '--progress=0'])
    rows = tables.cells((out / 'results.md').read_text())
    assert [cells[1] for cells in rows.values()] == ['1/1', '1/1']  # both configs trained a seed
    forget()
    trained = run('--rule_module=my_rules', '--residual=dense_half', '--max_iters=4', '--eval_interval=4')
    forget()
    ablate.main([f'--out_dir={trained}', '--eval_iters=1'])
    assert '| weights_at_init |' in capsys.readouterr().out  # its parent's ablation, the module imported again


def test_a_reader_that_cannot_import_the_module_says_so_in_one_line(run, my_rules, monkeypatch):
    folder, forget = my_rules
    out = run('--rule_module=my_rules', '--residual=halfway', '--max_iters=2', '--eval_interval=2')
    forget()
    monkeypatch.setattr(sys, 'path', [p for p in sys.path if p != str(folder)])
    with pytest.raises(SystemExit, match=r"rule_module='my_rules' cannot be imported here \(ModuleNotFoundError: No "
                                         r"module named 'my_rules'\); put my_rules.py beside train.py, or its folder "
                                         r"on the path \(PYTHONPATH=DIR\)"):
        sample.main([f'--out_dir={out}', '--num_samples=1', '--max_new_tokens=2'])
