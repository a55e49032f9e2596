"""Gradient norms per residual layer, training dynamics and effective rank."""

import math

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
        assert stats.shape == (4, len(diagnostics.STATS))
        assert stats[:, 5:].isnan().all()  # no H_res
        torch.testing.assert_close(stats[:, 1] + stats[:, 2], f_sq, rtol=1e-5, atol=0)
        assert torch.all(stats[:, 3].abs() <= 1)
        if residual == 'rotation':
            torch.testing.assert_close(stats[:, 0], torch.full((4,), 16.0, dtype=torch.float64))  # ||x||^2 = d
            torch.testing.assert_close(stats[:, 4], angle, rtol=1e-3, atol=0)
        else:
            assert not torch.allclose(stats[:, 4], angle, rtol=1e-2, atol=0)


def test_update_stats_measure_what_the_branch_reads():
    """Attention Residuals at init read the mean of their sources, not the stream they pass on (the sources' sum): at
    the first sublayer the embeddings x, at the second (x + the first output) / 2, half the stream."""
    model = GPT(GPTConfig(residual='attnres', n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11))
    streams = []
    hooks = [m.register_forward_pre_hook(lambda m, args: streams.append(args[0].double()))
             for _, _, m in diagnostics.updates(model)]
    stats = diagnostics.update_stats(model, torch.randint(11, (3, 8))).double()
    for h in hooks:
        h.remove()
    square = [(x * x).sum(-1).mean() for x in streams]
    torch.testing.assert_close(stats[:2, 0], torch.stack([square[0], square[1] / 4]), rtol=1e-5, atol=0)


def mixings(model, idx):
    """The H_res (tokens, n, n) of each sublayer of an mHC model on idx, in float64, in layer order."""
    streams = []
    hooks = [m.register_forward_pre_hook(lambda m, args: streams.append((m, args[0])))
             for _, _, m in diagnostics.updates(model)]
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    return [m.coefficients(x.double())[2].flatten(0, -3) for m, x in streams]


@pytest.mark.parametrize('res', ['sinkhorn', 'permutation', 'cayley'])
def test_mixing_stats_against_float64(gpt_config, res):
    """H_res's off-diagonal mass, distance from I and rotation angle per sublayer, with coefficients drawn away
    from their initial values, against float64 values found another way: for a doubly stochastic H_res the mass
    as the rows' off-diagonal sums; for an orthogonal one the eigenvalues of (H + H^T) / 2, cos theta_k, give
    the mass (1 - their mean) and the angle (arccos of the smallest)."""
    torch.manual_seed(0)
    model = GPT(gpt_config(residual='mhc', mhc_res=res, mhc_res_init=1.0)).double()
    with torch.no_grad():  # H_res far from I, and from token to token
        for _, _, m in diagnostics.updates(model):
            m.phi.normal_(0, 0.3)
            m.a_res.fill_(1.0)
    idx = torch.randint(11, (3, 8))
    stats = diagnostics.update_stats(model, idx)[:, 5:].double()
    eye = torch.eye(4, dtype=torch.float64)
    for (offdiag, dist, angle), H in zip(stats, mixings(model, idx)):
        assert H.std(0).max() > 1e-2
        torch.testing.assert_close(dist, (H - eye).square().sum((-2, -1)).sqrt().mean(), rtol=1e-6, atol=0)
        if res == 'cayley':
            cos = torch.linalg.eigvalsh((H + H.mT) / 2)  # (tokens, n), ascending
            torch.testing.assert_close(offdiag, (1 - cos).mean(), rtol=1e-6, atol=0)
            torch.testing.assert_close(angle, cos[:, 0].clamp(-1, 1).acos().mean(), rtol=1e-5, atol=0)
            assert 0.3 < angle < math.pi
        else:
            torch.testing.assert_close(offdiag, (H.sum(-1) - H.diagonal(dim1=-2, dim2=-1)).mean(), rtol=1e-6, atol=0)
            assert offdiag > 0.1 and angle.isnan()  # not orthogonal: no angle


@pytest.mark.parametrize('res,init,mass', [('sinkhorn', 0.0, 0.75), ('cayley', 0.0, 0.0), ('identity', 8.0, 0.0)])
def test_mixing_stats_at_init(gpt_config, res, init, mass):
    """Uniform mixing J/n takes 1 - 1/n from the other copies, ||J/n - I||_F = sqrt(n - 1); the Cayley mixer and
    the identity start at I, a rotation by 0."""
    model = GPT(gpt_config(residual='mhc', mhc_res=res, mhc_res_init=init))
    stats = diagnostics.update_stats(model, torch.randint(11, (3, 8)))[:, 5:]
    expected = [mass, math.sqrt(3) if mass else 0.0, math.nan if mass else 0.0]
    torch.testing.assert_close(stats, torch.tensor([expected] * 4), equal_nan=True)


def test_effective_rank():
    g = torch.Generator().manual_seed(0)
    assert diagnostics.effective_rank(torch.randn(20000, 8, generator=g)) == pytest.approx(8, rel=0.01)
    line = torch.randn(500, 1, generator=g) * torch.randn(1, 8, generator=g)
    assert diagnostics.effective_rank(line) == pytest.approx(1, abs=1e-6)
