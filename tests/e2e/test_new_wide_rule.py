"""A rule with a wider stream, defined here and registered, works with no project file edited:
training and resume, sample.py, decoding through the state, torch.compile and the gradient-norm diagnostic."""

import pytest
import torch

import sample
from model import GPT, GPTConfig, ResidualUpdate

TINY_GPT = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=11)


class Twins(ResidualUpdate):
    """Two copies of the stream: a branch reads their mean and writes into one copy, the copy
    (layer mod 2); the head reads their mean. A toy: it starts as the additive model."""

    def __init__(self, layer):
        super().__init__()
        self.register_buffer('into', torch.tensor([[1.0], [0.0]]).roll(layer % 2, 0), persistent=False)

    @classmethod
    def from_config(cls, cfg, layer, causal):
        return cls(layer)

    @classmethod
    def copies(cls, cfg):  # (B, T, d) -> (B, T, 2, d)
        return 2

    def prepare(self, x, sub):
        return x.mean(-2)

    def forward(self, x, u, sub):
        return x + self.into * u.unsqueeze(-2)


@pytest.fixture(autouse=True)
def twins(registered):
    registered('twins', Twins)


def test_it_trains_resumes_and_samples(run, logs, capsys):
    out = run('--residual=twins', '--max_iters=20', '--eval_interval=10', '--learning_rate=3e-2')
    history = logs.evals(out)
    assert history[-1][1] < 0.8 * history[0][1]
    run('--residual=twins', '--max_iters=30', '--eval_interval=10', '--learning_rate=3e-2', '--init_from=resume')
    assert [i for i, _ in logs.evals(out)] == [0, 10, 20, 30]
    capsys.readouterr()
    sample.main([f'--out_dir={out}', '--start=ROMEO:', '--num_samples=1', '--max_new_tokens=8'])
    assert capsys.readouterr().out.startswith('ROMEO:')


def test_decoding_through_the_state_and_compile_see_the_wide_stream(decodes_in_pieces):
    net = GPT(GPTConfig(residual='twins', **TINY_GPT)).double().eval()
    idx = torch.randint(11, (3, 16))
    full = decodes_in_pieces(net, idx)
    torch._dynamo.reset()
    compiled = torch.compile(net, backend='aot_eager', fullgraph=True)
    torch.testing.assert_close(compiled(idx)[0], full)


def test_the_gradient_norm_diagnostic_measures_it(grad_norms):
    rows = grad_norms('--residual=twins')
    assert [r['residual'] for r in rows] == ['twins'] * 4 and all(float(r['grad_norm']) > 0 for r in rows)
