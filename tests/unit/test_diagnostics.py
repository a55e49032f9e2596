"""Gradient norms per residual layer, training dynamics and effective rank."""

import pytest
import torch

from model import GPT, GPTConfig
from orthogpt import diagnostics


def test_residual_grads_are_the_autograd_gradients():
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11))
    idx = torch.randint(11, (3, 8))
    outs = []

    def keep(module, inputs, output):
        output.retain_grad()
        outs.append(output)
    hooks = [m.register_forward_hook(keep) for _, _, m in diagnostics.updates(model)]
    with diagnostics.residual_grads(model) as grads:
        model(idx, idx)[1].backward()
    for h in hooks:
        h.remove()
    for g, x in zip(grads, outs):
        assert torch.allclose(g, x.grad.norm(dim=-1).mean())


def test_update_stats():
    """Against each update's own input and output: on the rotation model ||x||^2 = d and theta is
    the angle by which the update turns the stream; for any rule ||f_par||^2 + ||f_perp||^2 = ||f||^2."""
    cfg = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11)
    idx = torch.randint(11, (3, 8))
    for residual in ('rotation', 'additive'):
        model = GPT(GPTConfig(residual=residual, **cfg))
        seen = []

        def record(module, args, out):
            x, u, y = (t.double() for t in (*args[:2], out))
            y_perp = y - (x * y).sum(-1, keepdim=True) / (x * x).sum(-1, keepdim=True) * x
            seen.append([torch.atan2(y_perp.norm(dim=-1), (x * y).sum(-1) / x.norm(dim=-1)).mean(),
                         (u * u).sum(-1).mean()])
        hooks = [m.register_forward_hook(record) for _, _, m in diagnostics.updates(model)]
        stats = diagnostics.update_stats(model, idx).double()
        for h in hooks:
            h.remove()
        angle, f_sq = torch.tensor(seen, dtype=torch.float64).T
        assert stats.shape == (4, 5)
        torch.testing.assert_close(stats[:, 1] + stats[:, 2], f_sq, rtol=1e-5, atol=0)
        assert torch.all(stats[:, 3].abs() <= 1)
        if residual == 'rotation':
            torch.testing.assert_close(stats[:, 0], torch.full((4,), 16.0, dtype=torch.float64))  # ||x||^2 = d
            torch.testing.assert_close(stats[:, 4], angle, rtol=1e-3, atol=0)
        else:
            assert not torch.allclose(stats[:, 4], angle, rtol=1e-2, atol=0)


def test_effective_rank():
    g = torch.Generator().manual_seed(0)
    assert diagnostics.effective_rank(torch.randn(20000, 8, generator=g)) == pytest.approx(8, rel=0.01)
    line = torch.randn(500, 1, generator=g) * torch.randn(1, 8, generator=g)
    assert diagnostics.effective_rank(line) == pytest.approx(1, abs=1e-6)
