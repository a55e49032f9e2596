"""The optimizer step: the learning-rate schedule, gradient accumulation as one big batch, what
weight decay reaches."""

from contextlib import nullcontext

import pytest
import torch

import configure
from model import GPT
from orthogpt import optim


def test_lr_schedule():
    cfg = configure.load(['--learning_rate=1.0', '--min_lr=0.1', '--warmup_iters=10', '--max_iters=110'])
    assert optim.get_lr(0, cfg) == pytest.approx(1 / 11)
    assert optim.get_lr(9, cfg) == pytest.approx(10 / 11)
    assert optim.get_lr(10, cfg) == pytest.approx(1.0)
    assert optim.get_lr(60, cfg) == pytest.approx(0.55)  # halfway down the cosine
    assert optim.get_lr(110, cfg) == optim.get_lr(500, cfg) == pytest.approx(0.1)
    assert optim.get_lr(25, cfg, start=20) == pytest.approx(6 / 11)  # warmup restarts where the optimizer was reset
    assert optim.get_lr(7, configure.load(['--decay_lr=False', '--learning_rate=0.3'])) == 0.3



@pytest.mark.parametrize('qkv', ['dense', 'cayley', 'exp'])
def test_gradient_accumulation_equals_one_big_batch(qkv, monkeypatch):
    """Also with orthogonal Q/K/V, whose maps run once per optimizer step (all layers batched)."""
    maps = []
    for name in ('inv_ex', 'matrix_exp'):
        f = getattr(torch.linalg, name)
        monkeypatch.setattr(torch.linalg, name, lambda *a, f=f, **k: maps.append(1) or f(*a, **k))
    cfg = configure.load(['--n_layer=2', '--n_head=2', '--n_embd=16', '--block_size=8', '--vocab_size=11',
                          '--weight_decay=0.1', '--learning_rate=1e-2', f'--qkv={qkv}'])
    x, y = torch.randint(11, (8, 8)), torch.randint(11, (8, 8))
    models = []
    for micro_steps in (1, 2, 4):
        torch.manual_seed(0)
        m = GPT(configure.model_config(cfg)).double()
        opt = optim.make_optimizer(m, cfg, 'cpu')
        parts = iter(zip(x.chunk(micro_steps), y.chunk(micro_steps)))
        maps.clear()
        optim.train_step(m, opt, optim.StepScaler('cpu', 'float32'), lambda: next(parts), micro_steps, 1.0, nullcontext())
        assert len(maps) == (0 if qkv == "dense" else 1)  # every layer in one batched call
        models.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
    assert torch.allclose(models[0], models[1], atol=1e-12) and torch.allclose(models[0], models[2], atol=1e-12)
    assert all(p.held is None for p in m.modules() if hasattr(p, 'held'))



def test_raw_orthogonal_weights_are_not_decayed():
    cfg = configure.load(['--n_layer=2', '--n_head=2', '--n_embd=16', '--vocab_size=11', '--qkv=cayley'])
    opt = optim.make_optimizer(GPT(configure.model_config(cfg)), cfg, 'cpu')
    decayed = {id(p) for p in opt.param_groups[0]['params']}
    raw = [p for g in opt.param_groups for p in g['params'] if p.shape == (48, 16)]
    assert len(raw) == 2 and not any(id(p) in decayed for p in raw)
