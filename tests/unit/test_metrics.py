"""What the logs put runs on a common axis with: val_bpb, bits per byte of text, and the FLOPs per token
that a training step counts for each rule."""

import math
from contextlib import nullcontext

import pytest
import torch

import configure
from orthogpt import chars, flops
from orthogpt.tasks import make_task


class ConstantLoss(torch.nn.Module):
    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def forward(self, x, y):
        return None, torch.tensor(self.loss)


def test_val_bpb_is_the_loss_in_bits_times_tokens_per_byte(tmp_path):
    """'é' is two bytes of UTF-8 and 'a' one: every window of an even length of 'éaéa...' holds 2 tokens per 3
    bytes, so a loss of L nats per token is L / ln 2 x 2/3 bits per byte."""
    (tmp_path / 'input.txt').write_text('éa' * 2000, encoding='utf-8')
    chars.prepare(None, str(tmp_path))
    cfg = configure.load(['--block_size=8', '--batch_size=3', f'--data_dir={tmp_path}'])
    task = make_task(cfg, 'cpu')
    metrics = task.evaluate(ConstantLoss(1.5), nullcontext(), False, eval_iters=2)
    assert metrics['val_loss'] == pytest.approx(1.5)
    assert metrics['val_bpb'] == pytest.approx(1.5 / math.log(2) * 2 / 3)


def small(*argv):
    cfg = configure.load(['--n_layer=2', '--n_head=2', '--n_embd=16', '--block_size=8', '--vocab_size=11', *argv])
    return configure.build_model(cfg), cfg


def counted(model, cfg, items_per_step):
    one = torch.zeros(1, cfg.block_size, dtype=torch.long)
    return flops.per_item(model, (one, one), items_per_step) / cfg.block_size


def test_the_count_of_the_additive_gpt_is_6n_plus_attention():
    """Every matrix product of forward and backward: 6 x the Linear weights (the tied head's included, the
    embedding lookups doing none), and attention's by torch's formula, on a CPU as on a GPU: 4 L T d forward and
    10 L T d backward (the scores computed again, as flash attention's backward does)."""
    model, cfg = small()
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert counted(model, cfg, 4) == 6 * weights + 14 * cfg.n_layer * cfg.block_size * cfg.n_embd
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize('argv', [['--residual=hc'], ['--residual=mhc'], ['--mlp=gated', '--mlp_ratio=4']])
def test_a_rules_extra_products_are_counted(argv):
    base, cfg = small()
    model, cfg = small(*argv)
    assert counted(model, cfg, 4) > counted(base, cfg, 4)


@pytest.mark.parametrize('qkv', ['cayley', 'exp'])
def test_the_maps_per_step_work_is_shared_by_the_steps_tokens(qkv):
    """A Q/K/V map runs once per step: its share of a token falls as the step holds more tokens, and the
    per-token rest is the dense model's and more (the map's products in backward are per step too)."""
    dense, cfg = small()
    model, _ = small(f'--qkv={qkv}')
    few, many = counted(model, cfg, 1), counted(model, cfg, 1000)
    assert few > many > counted(dense, cfg, 1)
    per_step = (few - many) * cfg.block_size / (1 - 1 / 1000)  # FLOPs of the maps in one step
    n, maps = cfg.n_embd, 3 * cfg.n_layer  # Q, K and V of each layer: d x d
    assert per_step >= maps * 2 * n ** 3  # at least the inverse (or exponential) of each
