"""residual='hc' and residual='mhc' (Hyper-Connections, D. Zhu et al., arXiv:2409.19606; mHC, Z. Xie
et al., arXiv:2512.24880) against float64 references written from the papers' equations: what the
model starts as, the read and the write of each layer, mHC's doubly stochastic mixing, and one
layer against the `hyper-connections` package where it is installed."""

import math
from contextlib import nullcontext

import pytest
import torch

import configure
from model import GPT, HyperConnection, ManifoldHyperConnection, sinkhorn
from orthogpt import optim

N, D = 4, 16


def randomised(rule):
    """rule with every parameter drawn away from its initial value, in float64."""
    rule = rule.double()
    with torch.no_grad():
        for p in rule.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return rule


def hc_reference(rule, H, u):
    """[HC] Eq. 2-5 and 10-13 with H (T, n, d): (h_0, the next H)."""
    out_h, out_H = [], []
    for Ht, ut in zip(H, u):
        if rule.dynamic:
            Hn = torch.nn.functional.layer_norm(Ht, (D,), rule.norm.weight.double(), rule.norm.bias.double())
            A = rule.s_alpha * torch.tanh(Hn @ rule.W_alpha) + rule.static_alpha  # (n, n + 1) = [A_m | A_r]
            B = rule.s_beta * torch.tanh(Hn @ rule.W_beta[:, 0]) + rule.static_beta  # (n,)
        else:
            A, B = rule.static_alpha, rule.static_beta
        out_h.append(A[:, 0] @ Ht)  # h_0^T = A_m^T H
        out_H.append(torch.outer(B, ut) + A[:, 1:].T @ Ht)  # B^T T(h_0) + A_r^T H
    return torch.stack(out_h), torch.stack(out_H)


def mhc_reference(rule, H, u):
    """[mHC] Eq. 3 and 7-9 with H (T, n, d), Sinkhorn written as the paper's alternation."""
    out_h, out_H = [], []
    for Ht, ut in zip(H, u):
        if rule.dynamic:
            x = Ht.reshape(-1)
            z = (x / x.square().mean().sqrt()) @ rule.phi
            pre, post = rule.a_pre * z[:N] + rule.b_pre, rule.a_post * z[N:2 * N] + rule.b_post
            res = rule.a_res * z[2 * N:].view(N, N) + rule.b_res
        else:
            pre, post, res = rule.b_pre, rule.b_post, rule.b_res
        M = torch.exp(res)
        for _ in range(rule.iters):
            M = M / M.sum(0, keepdim=True)  # T_c
            M = M / M.sum(1, keepdim=True)  # T_r
        out_h.append(torch.sigmoid(pre) @ Ht)
        out_H.append(M @ Ht + torch.outer(2 * torch.sigmoid(post), ut))
    return torch.stack(out_h), torch.stack(out_H)


@pytest.mark.parametrize('dynamic', [True, False])
@pytest.mark.parametrize('cls,reference', [(HyperConnection, hc_reference), (ManifoldHyperConnection, mhc_reference)],
                         ids=['hc', 'mhc'])
def test_each_layer_computes_its_papers_equations(cls, reference, dynamic):
    rule = randomised(cls(D, N, 3, dynamic) if cls is HyperConnection else cls(D, N, 3, dynamic, 20))
    H, u = torch.randn(6, N, D, dtype=torch.float64), torch.randn(6, D, dtype=torch.float64)
    with torch.no_grad():
        h, H_next = reference(rule, H, u)
        torch.testing.assert_close(rule.read(H), h, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(rule(H, u), H_next, rtol=1e-10, atol=1e-10)
    assert torch.autograd.gradcheck(lambda H, u: rule(H, u).sum() + rule.read(H).sum(),
                                    (H[:2].requires_grad_(), u[:2].requires_grad_()))


@pytest.mark.parametrize('dynamic', [True, False])
@pytest.mark.parametrize('cls', [HyperConnection, ManifoldHyperConnection], ids=['hc', 'mhc'])
def test_mixed_precision_leaves_the_stream_in_float32(cls, dynamic):
    """Under bfloat16 autocast the weights and the mixing are the float32 ones, digit for digit, and
    static HC at init writes x + u exactly, as the additive rule's float32 stream does."""
    rule = cls(D, N, 3, dynamic) if cls is HyperConnection else cls(D, N, 3, dynamic, 20)
    H, u = torch.randn(6, N, D) * 20, torch.randn(6, D).bfloat16()
    with torch.no_grad():
        plain = rule.read(H), rule(H, u)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            mixed = rule.read(H), rule(H, u)
    for a, b in zip(plain, mixed):
        assert b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    if cls is HyperConnection and not dynamic:
        torch.testing.assert_close(mixed[1], H + u.float().unsqueeze(-2), rtol=0, atol=0)


@pytest.mark.parametrize('residual', ['hc', 'mhc'])
@pytest.mark.parametrize('dynamic', [True, False])
def test_at_init_the_model_is_the_pre_norm_additive_one(gpt_config, residual, dynamic):
    """[HC] Sec. 2.3, Eq. 14 (and mHC's init here, which its docstring gives): every copy of the
    stream is the pre-norm model's stream after every block, and the head reads the final norm of
    their sum, n times that stream (Alg. 1)."""
    torch.manual_seed(0)
    wide = GPT(gpt_config(residual=residual, hc_dynamic=dynamic, n_layer=3)).double()
    plain = GPT(gpt_config(n_layer=3)).double()
    plain.load_state_dict({k: v for k, v in wide.state_dict().items() if k in plain.state_dict()})
    with torch.no_grad():
        for p in plain.parameters():  # any weights: the equivalence is the connections', not the init's
            p.add_(0.1 * torch.randn_like(p))
        wide.load_state_dict(plain.state_dict(), strict=False)
    idx = torch.randint(11, (2, 16))
    streams = {}
    for name, model in (('wide', wide), ('plain', plain)):
        outs = []
        hooks = [b.register_forward_hook(lambda m, i, o: outs.append(o)) for b in model.blocks]
        logits = model(idx)[0]
        for h in hooks:
            h.remove()
        streams[name] = (outs, logits)
    for H, x in zip(*(streams[n][0] for n in ('wide', 'plain'))):
        assert H.shape == (2, 16, N, D)
        torch.testing.assert_close(H, x.unsqueeze(-2).expand_as(H), rtol=1e-10, atol=1e-10)  # float64 rounding
    h = streams['plain'][0][-1]
    expected = plain.lm_head(plain.ln_f(N * h))
    torch.testing.assert_close(streams['wide'][1], expected, rtol=1e-10, atol=1e-10)


def test_mhc_mixing_is_doubly_stochastic_at_init_and_after_training(gpt_config):
    """Rows sum to 1 to float32 rounding (Sinkhorn-Knopp's last step normalises them), columns to
    within the tolerance measured at the paper's 20 rounds (the rule's docstring), every entry of
    H_res, H_pre and H_post non-negative."""
    cfg = configure.load(['--residual=mhc', '--n_layer=2', '--n_head=2', '--n_embd=16', '--vocab_size=11',
                          '--block_size=16', '--learning_rate=3e-2', '--weight_decay=0'])
    model = GPT(configure.model_config(cfg))
    opt = optim.make_optimizer(model, cfg, 'cpu')
    x = torch.randint(11, (8, 16))
    for step in range(31):
        if step % 15 == 0:
            for rule in (m for m in model.modules() if isinstance(m, ManifoldHyperConnection)):
                H = rule.widen(cfg, torch.randn(8, 16, D))
                pre, post, res = rule.weights(H)
                assert (res.sum(-1) - 1).abs().max() < 4e-7
                assert (res.sum(-2) - 1).abs().max() < 1e-3
                assert res.min() >= 0 and pre.min() >= 0 and post.min() >= 0
        optim.train_step(model, opt, optim.StepScaler('cpu', 'float32'), lambda: (x, torch.roll(x, -1, 1)), 1, 1.0,
                         nullcontext())
    assert any(m.phi.abs().max() > 0 for m in model.modules() if isinstance(m, ManifoldHyperConnection))  # it trained


def test_sinkhorn_is_exact_on_rows_and_converges_on_columns():
    torch.manual_seed(0)
    logits = 2 * torch.randn(1000, N, N)
    few, many = sinkhorn(logits, 3), sinkhorn(logits, 20)
    for m in (few, many):
        assert (m.sum(-1) - 1).abs().max() < 4e-7 and m.min() >= 0
    assert (many.sum(-2) - 1).abs().max() < (few.sum(-2) - 1).abs().max()  # more rounds, closer columns


def test_static_weights_take_no_decay_dynamic_ones_do_and_muon_takes_neither(gpt_config):
    """[HC] Sec. 4: weight decay on the dynamic weights only; Muon keeps to the branches' matrices."""
    for residual in ('hc', 'mhc'):
        cfg = configure.load([f'--residual={residual}', '--optimizer=muon', '--weight_decay=0.1', '--n_layer=1',
                              '--n_head=2', '--n_embd=16', '--vocab_size=11'])
        model = GPT(configure.model_config(cfg))
        opt = optim.make_optimizer(model, cfg, 'cpu')
        where = {p: (name, g['weight_decay']) for name, o in opt.named.items() for g in o.param_groups for p in g['params']}
        rule = model.blocks[0].update_attn
        static = (rule.static_alpha, rule.static_beta) if residual == 'hc' else (rule.b_pre, rule.b_post, rule.b_res)
        dynamic = (rule.W_alpha, rule.W_beta) if residual == 'hc' else (rule.phi,)
        assert all(where[p] == ('adamw', 0.0) for p in static)
        assert all(where[p] == ('adamw', 0.1) for p in dynamic)
        assert where[model.blocks[0].attn.c_proj.weight][0] == 'muon'


def test_one_layer_against_the_hyper_connections_package():
    """HC against `hyper-connections` (PyPI, lucidrains, >= 0.3.10): the same equations, its streams
    folded into the batch ((b s) t d). Its internal norm is an RMSNorm where ours is Alg. 2's
    LayerNorm: on streams of zero mean per vector the two agree. mHC differs from it by design (it
    computes its coefficients per copy, not from the flattened stream), so only the static path is
    compared: our biases given its static weights."""
    package = pytest.importorskip('hyper_connections')
    from importlib.metadata import version
    if tuple(map(int, version('hyper-connections').split('.')[:3])) < (0, 3, 10):
        pytest.skip('hyper-connections before 0.3.10 left out the residual mixing (its issue #8)')
    torch.manual_seed(0)
    H = torch.randn(2, 5, N, D)
    H = H - H.mean(-1, keepdim=True)
    u = torch.randn(2, 5, D)
    theirs = package.HyperConnections(N, dim=D, layer_index=1)
    ours = HyperConnection(D, N, 1, True)
    with torch.no_grad():
        for name in ('static_alpha', 'static_beta'):
            getattr(theirs, name).add_(0.3 * torch.randn_like(getattr(theirs, name)))
            getattr(ours, name).copy_(getattr(theirs, name))
        theirs.dynamic_alpha_fn.normal_(0, 0.3)
        theirs.dynamic_beta_fn.normal_(0, 0.3)
        ours.W_alpha.copy_(theirs.dynamic_alpha_fn)
        ours.W_beta.copy_(theirs.dynamic_beta_fn[:, None])
        ours.s_alpha.copy_(theirs.dynamic_alpha_scale.reshape(1))
        ours.s_beta.copy_(theirs.dynamic_beta_scale.reshape(1))
    folded = H.permute(0, 2, 1, 3).reshape(2 * N, 5, D)
    branch_input, add_residual = theirs(folded)
    torch.testing.assert_close(ours.read(H), branch_input, rtol=1e-4, atol=1e-5)
    expected = add_residual(u).reshape(2, N, 5, D).permute(0, 2, 1, 3)
    torch.testing.assert_close(ours(H, u), expected, rtol=1e-4, atol=1e-5)

    theirs = package.mHC(N, dim=D, layer_index=1)
    ours = ManifoldHyperConnection(D, N, 1, False, 20)
    with torch.no_grad():
        theirs.static_alpha.add_(0.3 * torch.randn_like(theirs.static_alpha))
        theirs.static_beta.add_(0.3 * torch.randn_like(theirs.static_beta))
        theirs.dynamic_alpha_fn.zero_()
        theirs.dynamic_beta_fn.zero_()
        ours.b_pre.copy_(theirs.static_alpha[:, 0])
        ours.b_res.copy_(theirs.static_alpha[:, 1:].T)  # theirs mixes by the transpose
        ours.b_post.copy_(theirs.static_beta)
    branch_input, add_residual = theirs(folded)
    torch.testing.assert_close(ours.read(H), branch_input, rtol=1e-4, atol=1e-5)
    expected = add_residual(u).reshape(2, N, 5, D).permute(0, 2, 1, 3)
    torch.testing.assert_close(ours(H, u), expected, rtol=1e-4, atol=1e-4)
    assert math.isfinite(expected.abs().max().item())
