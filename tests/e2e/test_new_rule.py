"""A fifth residual rule, defined here and registered, works everywhere with no project file edited:
the config and --help, training and its after-step hook, sample.py, resume and its checks,
torch.compile, decoding through the state, the gradient-norm diagnostic, the dynamics statistics and bench.py;
and a rule that mixes positions keeps its own per-position terms in the decode state."""

import math
import os

import pytest
import torch
import torch.nn as nn

import configure
import sample
from model import GPT, RESIDUALS, DecodeState, GPTConfig, ResidualUpdate, register
from orthogpt import checkpoint, decoding, diagnostics
from orthogpt.errors import UserError
from tools import bench

TINY_GPT = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=11)


class SphereUpdate(ResidualUpdate):
    """x_next = sqrt(d) (x + g * u) / ||x + g * u||, a learnable gain g per dimension, kept in [0, 1]
    after every optimizer step. A toy: it keeps ||x|| = sqrt(d), so the model drops its norms."""
    keeps_norm = True

    def __init__(self, d):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(d))

    @classmethod
    def from_config(cls, cfg, layer, causal):
        return cls(cfg.n_embd)

    @classmethod
    def after_step(cls, model):
        for m in model.modules():
            if isinstance(m, cls):
                m.gain.clamp_(0, 1)

    def forward(self, x, u, sub=None):
        y = x + self.gain * u
        return y * (math.sqrt(x.shape[-1]) / y.norm(dim=-1, keepdim=True))


@pytest.fixture(autouse=True)
def sphere():
    """Registered as a user would, for this module's tests only."""
    assert register('sphere')(SphereUpdate) is SphereUpdate
    yield
    del RESIDUALS['sphere']


def gains(state):
    return torch.cat([v for k, v in state.items() if k.endswith('.gain')])


def test_the_config_and_help_accept_it():
    assert configure.load(['--residual=sphere']).residual == 'sphere'
    residual = next(line for line in configure.usage().splitlines() if line.strip().startswith('residual='))
    assert "| 'sphere'" in residual
    with pytest.raises(UserError, match="did you mean 'sphere'"):
        configure.load(['--residual=spheer'])


def test_it_trains_with_its_hook_samples_and_resumes_only_into_its_own_architecture(run, logs, capsys):
    out = run('--residual=sphere', '--max_iters=20', '--eval_interval=10', '--learning_rate=3e-2')
    history = logs.evals(out)
    assert history[-1][1] < history[0][1]
    state = checkpoint.load(out / 'ckpt.pt')['model']
    assert not any('ln_' in k for k in state)  # keeps_norm: no norms in the blocks, none at the end
    g = gains(state)
    assert g.max() == 1 and g.min() < 1  # trained, and after_step clamped the gains that rose
    capsys.readouterr()
    sample.main([f'--out_dir={out}', '--start=ROMEO:', '--num_samples=1', '--max_new_tokens=8'])
    assert capsys.readouterr().out.startswith('ROMEO:')
    run('--residual=sphere', '--max_iters=30', '--eval_interval=10', '--learning_rate=3e-2', '--init_from=resume')
    assert logs.evals(out)[-1][0] == 30
    with pytest.raises(SystemExit, match="residual 'sphere' -> 'additive': the two rules build different parameters"):
        run('--residual=additive', '--max_iters=40', '--init_from=resume')


def test_it_compiles_in_one_graph():
    torch._dynamo.reset()
    net = GPT(GPTConfig(residual='sphere', **TINY_GPT))
    compiled = torch.compile(net, backend='aot_eager', fullgraph=True)
    idx = torch.randint(11, (2, 16))
    grads = []
    for m in (net, compiled):
        m(idx, torch.roll(idx, -1, 1))[1].backward()
        grads.append([p.grad.clone() for p in net.parameters()])
        net.zero_grad()
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_decoding_through_the_state_gives_the_full_forward_and_the_same_tokens(decodes_in_pieces):
    net = GPT(GPTConfig(residual='sphere', **TINY_GPT)).double().eval()
    idx = torch.randint(11, (3, 16))
    decodes_in_pieces(net, idx)
    runs = [decoding.generate(net, idx[:, :3], 30, top_k=5, use_cache=c, generator=torch.Generator().manual_seed(0))
            for c in (True, False)]
    assert torch.equal(*runs)


class RunningMean(ResidualUpdate):
    """x_next = x + the mean of u over positions <= t: a causal rule that mixes positions, so that decoding keeps
    every position's u in the decode state (cache.write) and each query averages those it sees. A toy."""

    def forward(self, x, u, sub=None):
        cache = sub and sub.cache
        if cache is None:
            sums, counts = u.cumsum(-2), torch.arange(1, u.shape[-2] + 1, dtype=u.dtype, device=u.device)[:, None]
        else:
            seen = cache.visible.to(u.dtype)  # (T, block_size)
            sums, counts = seen @ cache.write(u, dim=-2)[0], seen.sum(-1, keepdim=True)
        return x + sums / counts


def test_a_rule_that_mixes_positions_keeps_its_terms_in_the_decode_state(registered, decodes_in_pieces):
    registered('running_mean', RunningMean)
    net = GPT(GPTConfig(residual='running_mean', **TINY_GPT)).double().eval()
    idx = torch.randint(11, (3, 16))
    decodes_in_pieces(net, idx)
    state = DecodeState(16)
    net(idx, cache=state)
    # each layer's writes in order: attention's keys and values, then each sublayer's every u
    assert [[[b.shape for b in bs] for bs in writes[1:]] for writes in state.buffers.values()] == [[[(3, 16, 16)]] * 2] * 2
    runs = [decoding.generate(net, idx[:, :3], 30, top_k=5, use_cache=c, generator=torch.Generator().manual_seed(0))
            for c in (True, False)]
    assert torch.equal(*runs)
    torch._dynamo.reset()
    compiled = torch.compile(net, backend='aot_eager', fullgraph=True, dynamic=False)
    with torch.no_grad():
        state.pos.zero_()
        pieces = [net(idx[:, :4], cache=state)[0]] + [compiled(idx[:, t:t + 1], cache=state)[0] for t in range(4, 16)]
    torch.testing.assert_close(torch.cat(pieces, 1), net(idx)[0], rtol=0, atol=1e-10)


def test_the_diagnostics_measure_it(grad_norms):
    rows = grad_norms('--residual=sphere')
    assert [r['residual'] for r in rows] == ['sphere'] * 4 and all(float(r['grad_norm']) > 0 for r in rows)
    stats = diagnostics.update_stats(GPT(GPTConfig(residual='sphere', **TINY_GPT)), torch.randint(11, (2, 16)))
    torch.testing.assert_close(stats[:, 0], torch.full((4,), 16.0))  # ||x||^2 = d before every update


def test_bench_times_it(char_data, root, capsys, tables):
    bench.main([os.path.join(root, 'config', 'shakespeare_add.py'), '--n_layer=1', '--n_head=2', '--n_embd=16',
                '--block_size=16', '--batch_size=2', '--device=cpu', '--steps=1', '--repeats=1', '--warmup=1',
                f'--data_dir={char_data}'])
    table = tables.cells(capsys.readouterr().out)
    assert list(table)[-3:] == ['sphere', 'cayley', 'exp']  # after the project's rules, before the Q/K/V maps
    _, ms, _, tok_s, *_ = table['sphere']
    assert tables.number(tok_s) == pytest.approx(2 * 16 / (tables.number(ms) / 1e3), rel=0.05)
