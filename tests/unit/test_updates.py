"""Each residual update rule against a float64 reference written from the paper's equations."""

import math

import pytest
import torch

from model import RESIDUALS, GPTConfig, OrthogonalUpdate, RotationUpdate, Sublayer, copied


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def ortho_reference(x, u, mode, eps, causal):
    """[Oh] Eq. 3-4 in float64: x + u - s x with s = <x,u> / (||x||^2 + eps), by explicit loops
    over samples (global) and prefixes (causal global)."""
    x, u = x.double(), u.double()
    out = torch.empty_like(x)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            if mode == 'feature':
                xs, us = x[b, t], u[b, t]
            elif causal:
                xs, us = x[b, :t + 1], u[b, :t + 1]
            else:
                xs, us = x[b], u[b]
            s = (xs * us).sum() / ((xs * xs).sum() + eps)
            out[b, t] = x[b, t] + u[b, t] - s * x[b, t]
    return out


def rotation_reference(x, u):
    """[OT] Eq. 4-6 in float64: x_next = expm(theta * B_hat) x with theta = ||u_perp|| / sqrt(d),
    p the unit tangential part of u and B_hat = p x_hat^T - x_hat p^T, the generator that turns x
    towards u as Eq. 7 does (the paper's x u^T - u x^T, applied to a column vector, turns it
    away). A d x d matrix exponential per token, independent of the closed form in the model."""
    x, u = x.double(), u.double()
    d = x.shape[-1]
    out = torch.empty_like(x)
    for i in range(x.shape[0]):
        xi, ui = x[i], u[i]
        u_perp = ui - (xi @ ui) / (xi @ xi) * xi
        theta = u_perp.norm() / math.sqrt(d)
        if theta == 0:
            out[i] = xi
            continue
        xh, p = xi / xi.norm(), u_perp / u_perp.norm()
        out[i] = torch.linalg.matrix_exp(theta * (torch.outer(p, xh) - torch.outer(xh, p))) @ xi
    return out


@pytest.mark.parametrize('name', list(RESIDUALS))
def test_every_rule_keeps_shape_and_dtype_and_declares_its_norm(name):
    """Every registered rule, as the model builds it, on its stream (the embeddings, copied where
    the rule keeps several copies): the stream's shape out, in the input's dtype; ||x|| kept exactly
    (on the sphere where the model keeps the stream of such a rule: of radius 1 for the normalized
    architecture, else sqrt(d)) where the rule declares keeps_norm, and changed where it does not;
    the branch reads a (B, T, d) vector from it."""
    cfg = GPTConfig(residual=name, n_embd=16, n_head=2)
    rule = RESIDUALS[name].from_config(cfg, 0, True)
    x, u = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 5, 16, dtype=torch.float64)
    x = copied(x / x.norm(dim=-1, keepdim=True) * (1 if RESIDUALS[name].normalized else 4), RESIDUALS[name].copies(cfg))
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        sub = Sublayer()
        rule.prepare(x.to(dtype), sub)
        assert rule(x.to(dtype), u.to(dtype), sub).dtype == dtype
    sub = Sublayer()
    h = rule.prepare(x, sub)
    out = rule(x, u, sub)
    assert out.shape == x.shape and h.shape == u.shape
    kept = torch.allclose(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)
    assert kept == RESIDUALS[name].keeps_norm


@pytest.mark.parametrize('mode,causal', [('feature', True), ('global', False), ('global', True)])
@pytest.mark.parametrize('eps', [1e-6, 1e-1])
def test_orthogonal_matches_float64_reference(mode, causal, eps):
    x, u = torch.randn(3, 7, 16), torch.randn(3, 7, 16)
    out = OrthogonalUpdate(mode, eps=eps, causal=causal)(x, u)
    assert out.dtype == torch.float32
    assert rel_err(out, ortho_reference(x, u, mode, eps, causal)) < 1e-6


@pytest.mark.parametrize('mode', ['feature', 'global'])
def test_orthogonal_component_is_orthogonal(mode):
    x, u = 3 * torch.randn(4, 6, 32), torch.randn(4, 6, 32)
    f_perp = OrthogonalUpdate(mode, causal=False)(x, u) - x
    if mode == 'feature':
        cos = (x * f_perp).sum(-1) / (x.norm(dim=-1) * f_perp.norm(dim=-1))
    else:
        cos = (x * f_perp).sum((1, 2)) / (x.norm(dim=(1, 2)) * f_perp.norm(dim=(1, 2)))
    assert cos.abs().max() < 1e-5
    # and the projection removed something: u itself is not orthogonal to x
    assert ((x * u).sum(-1)).abs().max() > 1e-2


def test_global_causal_prefix_never_sees_the_future():
    x, u = torch.randn(2, 9, 8), torch.randn(2, 9, 8)
    rule = OrthogonalUpdate('global', causal=True)
    x2, u2 = x.clone(), u.clone()
    x2[:, 5:] += torch.randn(2, 4, 8)
    u2[:, 5:] += torch.randn(2, 4, 8)
    a, b = rule(x, u), rule(x2, u2)
    assert torch.equal(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])
    # the last position equals the paper's plain global projection (Alg. 2)
    plain = OrthogonalUpdate('global', causal=False)(x, u)
    assert torch.allclose(a[:, -1], plain[:, -1], atol=1e-6)


@pytest.mark.parametrize('rule', [OrthogonalUpdate('feature'), OrthogonalUpdate('global', causal=True), RotationUpdate()],
                         ids=['feature', 'global-causal', 'rotation'])
def test_half_inputs_are_computed_in_float32(rule):
    """[Oh] App. F: the rule's arithmetic in float32, rounded to bfloat16 once, at the end."""
    x, u = torch.randn(2, 4, 8).bfloat16(), torch.randn(2, 4, 8).bfloat16()
    assert torch.equal(rule(x, u), rule(x.float(), u.float()).bfloat16())


def test_orthogonal_probability_training_and_expected_eval():
    p, B = 0.3, 4000
    x, u = torch.randn(B, 3, 8), torch.randn(B, 3, 8)
    rule = OrthogonalUpdate('feature', prob=p)
    ortho = OrthogonalUpdate('feature')(x, u)
    out = rule(x, u)  # modules start in training mode
    is_ortho = torch.isclose(out, ortho, atol=1e-6).flatten(1).all(1)
    is_add = torch.isclose(out, x + u, atol=1e-6).flatten(1).all(1)
    assert torch.all(is_ortho ^ is_add), "each sample's connection is wholly orthogonal or wholly additive"
    assert abs(is_ortho.float().mean().item() - p) < 0.03
    rule.eval()
    s = OrthogonalUpdate('feature').scale(x, u)
    assert torch.allclose(rule(x, u), x + u - p * s * x, atol=1e-6)


@pytest.mark.parametrize('scale', [1e-6, 1e-4, 9e-3, 1.1e-2, 0.1, 0.7, 2.0, 5.0])
def test_rotation_matches_matrix_exponential(scale):
    d = 16
    x = torch.randn(64, d)
    x = x / x.norm(dim=-1, keepdim=True) * math.sqrt(d)
    u = 0.5 * x + scale * torch.randn(64, d)  # theta ~ scale: covers both sides of the small-angle switch
    out = RotationUpdate()(x, u)
    assert rel_err(out, rotation_reference(x, u)) < 2e-6
    assert (out.norm(dim=-1) / math.sqrt(d) - 1).abs().max() < 1e-6


def test_rotation_zero_angle_is_identity_with_finite_gradients():
    x = torch.randn(4, 16, requires_grad=True)
    for u in (torch.zeros(4, 16, requires_grad=True), (2.0 * x.detach()).requires_grad_()):
        out = RotationUpdate()(x, u)
        assert torch.allclose(out, x, atol=1e-6)
        out.square().sum().backward()
        assert torch.isfinite(x.grad).all() and torch.isfinite(u.grad).all()
        x.grad = None


def test_rotation_gradients_match_float64_reference():
    d = 8
    x = torch.randn(6, d, dtype=torch.float64)
    x = x / x.norm(dim=-1, keepdim=True) * math.sqrt(d)
    u = torch.randn(6, d, dtype=torch.float64)
    u[0] = 0.3 * x[0] + 1e-3 * torch.randn(d, dtype=torch.float64)  # one token in the small-angle branch
    w = torch.randn(6, d, dtype=torch.float64)
    grads = []
    for fn, dtype in ((RotationUpdate(), torch.float32), (rotation_reference, torch.float64)):
        xi, ui = x.to(dtype).requires_grad_(), u.to(dtype).requires_grad_()
        (fn(xi, ui).double() * w).sum().backward()
        grads.append((xi.grad.double(), ui.grad.double()))
    (gx, gu), (rx, ru) = grads
    assert rel_err(gu, ru) < 1e-5
    # the two agree on the sphere ||x|| = sqrt(d), so only the tangential part of d/dx must match
    tangent = lambda g: g - (g * x).sum(-1, keepdim=True) / d * x  # noqa: E731
    assert rel_err(tangent(gx), tangent(rx)) < 1e-5


def seeded_rule(rule, seed=3):
    """rule(x, u) drawing the same stochastic connections at every call, for gradcheck."""
    def f(x, u):
        torch.manual_seed(seed)
        return rule(x, u)
    return f


@pytest.mark.parametrize('mode,causal,prob,training', [
    ('feature', True, 1.0, True), ('global', False, 1.0, True), ('global', True, 1.0, True),
    ('feature', True, 0.5, True), ('global', True, 0.5, True), ('global', False, 0.3, False)])
def test_orthogonal_gradient_by_finite_differences(mode, causal, prob, training):
    """The gradient autograd derives through the rule against finite differences, in float64."""
    x = torch.randn(4, 5, 6, dtype=torch.float64, requires_grad=True)
    u = torch.randn(4, 5, 6, dtype=torch.float64, requires_grad=True)
    rule = OrthogonalUpdate(mode, eps=1e-3, prob=prob, causal=causal).train(training)
    assert torch.autograd.gradcheck(seeded_rule(rule), (x, u))


def test_rotation_gradient_by_finite_differences():
    """The rotation gradient against finite differences, in float64, for tokens at large angles
    and tokens below the small-angle switch (where it is the series' gradient)."""
    d = 6
    x = torch.randn(8, d, dtype=torch.float64)
    u = 2 * torch.randn(8, d, dtype=torch.float64)
    u[:3] = 0.7 * x[:3] + 1e-3 * torch.randn(3, d, dtype=torch.float64)  # theta ~ 1e-3
    x[5] *= 3  # off the sphere: the rule's gradient is defined everywhere
    assert torch.autograd.gradcheck(RotationUpdate(), (x.requires_grad_(), u.requires_grad_()))


@pytest.mark.parametrize('rule', [OrthogonalUpdate('feature'), OrthogonalUpdate('global', causal=True), RotationUpdate()],
                         ids=['feature', 'global-causal', 'rotation'])
def test_half_precision_gradients_keep_their_dtype(rule):
    x = torch.randn(2, 4, 8).bfloat16().requires_grad_()
    u = torch.randn(2, 4, 8).bfloat16().requires_grad_()
    rule(x, u).float().square().sum().backward()
    assert x.grad.dtype == u.grad.dtype == torch.bfloat16
    xf, uf = x.detach().float().requires_grad_(), u.detach().float().requires_grad_()
    rule(xf, uf).square().sum().backward()
    assert rel_err(x.grad, xf.grad) < 2e-2 and rel_err(u.grad, uf.grad) < 2e-2


@pytest.mark.parametrize('rule', [OrthogonalUpdate('feature', eps=1e-3), OrthogonalUpdate('global', eps=1e-3, causal=True),
                                  RotationUpdate()], ids=['feature', 'global-causal', 'rotation'])
def test_second_derivatives_by_finite_differences(rule):
    """Autograd differentiates the rules twice (Hessian-vector products, gradient penalties)."""
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    u = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(rule, (x, u))
