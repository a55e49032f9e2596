"""residual='hc' and residual='mhc' (Hyper-Connections, D. Zhu et al., arXiv:2409.19606; mHC, Z. Xie
et al., arXiv:2512.24880) against float64 references written from the papers' equations: what the
model starts as, the read and the write of each layer, mHC's doubly stochastic mixing, and one
layer against the `hyper-connections` package where it is installed."""

import math
import typing
from contextlib import nullcontext

import pytest
import torch

import configure
from model import GPT, HyperConnection, ManifoldHyperConnection, Sublayer, copied, sinkhorn
from orthogpt import optim

N, D = 4, 16
MIXINGS = typing.get_args(ManifoldHyperConnection.Options.__dataclass_fields__['mhc_res'].type)  # mhc_res


def randomised(rule):
    """rule with every parameter drawn away from its initial value, in float64."""
    rule = rule.double()
    with torch.no_grad():
        for p in rule.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return rule


def sublayer(rule, H, u):
    """(the branch's input, the next stream) of one sublayer of rule on the stream H."""
    sub = Sublayer()
    return rule.prepare(H, sub), rule(H, u, sub)


def hc_reference(rule, H, u):
    """[HC] Eq. 2-5 and 10-13 with H (T, n, d): (h_0, the next H)."""
    out_h, out_H = [], []
    for Ht, ut in zip(H, u):
        if rule.dynamic:
            Hn = torch.nn.functional.layer_norm(Ht, (D,), rule.norm.weight.double(), rule.norm.bias.double())
            A = rule.s_alpha * torch.tanh(Hn @ rule.W[:, :-1]) + rule.static_alpha  # (n, n + 1) = [A_m | A_r]
            B = rule.s_beta * torch.tanh(Hn @ rule.W[:, -1]) + rule.static_beta  # (n,)
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
        ours = sublayer(rule, H, u)
        torch.testing.assert_close(ours[0], h, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(ours[1], H_next, rtol=1e-10, atol=1e-10)
    assert torch.autograd.gradcheck(lambda H, u: sum(t.sum() for t in sublayer(rule, H, u)),
                                    (H[:2].requires_grad_(), u[:2].requires_grad_()))


@pytest.mark.parametrize('dynamic', [True, False])
@pytest.mark.parametrize('cls', [HyperConnection, ManifoldHyperConnection], ids=['hc', 'mhc'])
def test_mixed_precision_stores_the_copies_in_bfloat16_and_computes_in_float32(cls, dynamic):
    """[mHC] Sec. 4.3.1: under bfloat16 autocast the copies are stored in bfloat16, while the weights, the read and
    the mixing are float32's digit for digit, rounded once where they are stored; and static HC at init writes
    x + u as float32 would, rounded once."""
    rule = cls(D, N, 3, dynamic) if cls is HyperConnection else cls(D, N, 3, dynamic, 20)
    H, u = (torch.randn(6, N, D) * 20).bfloat16(), torch.randn(6, D).bfloat16()
    with torch.no_grad():
        plain = sublayer(rule, H.float(), u.float())
        with torch.autocast('cpu', dtype=torch.bfloat16):
            mixed = sublayer(rule, H, u)
    for a, b in zip(plain, mixed):
        assert a.dtype == torch.float32 and b.dtype == torch.bfloat16
        torch.testing.assert_close(b, a.bfloat16(), rtol=0, atol=0)
    if cls is HyperConnection and not dynamic:
        torch.testing.assert_close(mixed[1], (H.float() + u.float().unsqueeze(-2)).bfloat16(), rtol=0, atol=0)


ARCHITECTURES = {'gpt2': dict(norm='layernorm', bias=True, activation='gelu_tanh', tie_weights=True, init='gpt2'),
                 'cpu-recipe': dict(norm='rmsnorm', init='sigma', tie_weights=False)}
WIDE = {'hc': dict(residual='hc'), 'hc-static': dict(residual='hc', hc_dynamic=False),
        'mhc-static': dict(residual='mhc', hc_dynamic=False),
        **{f'mhc-{res}': dict(residual='mhc', mhc_res=res) for res in MIXINGS},
        **{f'mhc-{res}-init{s:g}': dict(residual='mhc', mhc_res=res, mhc_res_init=s)  # near I, and uniform
           for res in ('sinkhorn', 'permutation') for s in (8.0, 0.0)}}


def streams_and_logits(model, idx):
    """(the stream after every block, the logits) of one forward of model on idx."""
    outs = []
    hooks = [b.register_forward_hook(lambda m, i, o: outs.append(o)) for b in model.blocks]
    try:
        return outs, model(idx)[0]
    finally:
        for h in hooks:
            h.remove()


@pytest.mark.parametrize('arch', ARCHITECTURES)
@pytest.mark.parametrize('variant', WIDE)
def test_at_init_the_model_is_the_pre_norm_additive_one(gpt_config, arch, variant):
    """[HC] Sec. 2.3, Eq. 14 (and mHC's init here, which its docstring gives): every copy of the
    stream is the pre-norm model's stream after every block, and the logits are the pre-norm
    model's, in float64 to 1e-8, under GPT-2's LayerNorm, biases and tied head as under the CPU
    recipe's RMSNorm: the final norm reads the copies' mean, which LayerNorm's eps cannot tell from
    the stream."""
    torch.manual_seed(0)
    wide = GPT(gpt_config(n_layer=3, **ARCHITECTURES[arch], **WIDE[variant])).double()
    plain = GPT(gpt_config(n_layer=3, **ARCHITECTURES[arch])).double()
    with torch.no_grad():
        for p in plain.parameters():  # any weights: the equivalence is the connections', not the init's
            p.add_(0.1 * torch.randn_like(p))
        wide.load_state_dict(plain.state_dict(), strict=False)
    idx = torch.randint(11, (2, 16))
    (wide_streams, wide_logits), (streams, logits) = streams_and_logits(wide, idx), streams_and_logits(plain, idx)
    for H, x in zip(wide_streams, streams):
        assert H.shape == (2, 16, N, D)
        torch.testing.assert_close(H, x.unsqueeze(-2).expand_as(H), rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(wide_logits, logits, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize('res', ['sinkhorn', 'permutation'])
def test_mhc_res_init_sets_how_much_each_copy_takes_from_the_others(res):
    """H_res at init, off its diagonal (the mean over rows of 1 - H_res[i, i]): 1 (the default) is lucidrains'
    logits = I for Sinkhorn, 8 leaves each copy 1e-3 from the others, 0 mixes uniformly (J/n);
    every one doubly stochastic, so equal copies stay equal (the test above)."""
    e = math.e
    expected = {'sinkhorn': {8.0: 3 / (e ** 8 + 3), 1.0: 3 / (e + 3), 0.0: 0.75},
                'permutation': {8.0: 1 - (e ** 8 + 5) / (e ** 8 + 23), 1.0: 1 - (e + 5) / (e + 23), 0.0: 0.75}}[res]
    for s, mass in expected.items():
        rule = ManifoldHyperConnection(D, N, 0, True, 20, res, res_init=s).double()
        M = rule.coefficients(torch.randn(5, N, D, dtype=torch.float64))[2]
        assert constraint_holds(res, M)
        torch.testing.assert_close((1 - M.diagonal(dim1=-2, dim2=-1)).mean(), torch.tensor(mass, dtype=torch.float64),
                                   rtol=1e-6, atol=0)


def test_mhc_res_init_must_be_finite(gpt_config):
    with pytest.raises(ValueError, match='mhc_res_init=inf must be a finite number'):
        gpt_config(residual='mhc', mhc_res_init=float('inf'))


def spread(H):
    """How far the copies of the stream H (..., n, d) are apart, relative to the stream."""
    return ((H - H.mean(-2, keepdim=True)).norm() / H.norm()).item()


def train_float64(model, steps, lr=1e-2):
    """model after `steps` AdamW steps in float64 on one random batch; returns the copies' spread
    after every block (the largest) of a forward on other tokens."""
    torch.manual_seed(1)
    model = model.double()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    x = torch.randint(11, (4, 16))
    for _ in range(steps):
        opt.zero_grad()
        model(x, torch.roll(x, -1, 1))[1].backward()
        opt.step()
    with torch.no_grad():
        return max(spread(H) for H in streams_and_logits(model, torch.randint(11, (4, 16)))[0])


@pytest.mark.parametrize('res', list(MIXINGS))
def test_mhc_copies_part_in_float64_by_their_initialisation(gpt_config, res):
    """H_pre favours one copy per layer at init, so the copies get different gradients and part at
    once, in exact arithmetic as in float32; with a uniform H_pre (symmetric in the copies) every
    copy gets the same gradient, and in float64 they stay together."""
    torch.manual_seed(0)
    assert train_float64(GPT(gpt_config(residual='mhc', mhc_res=res)), 0) < 1e-15  # equal copies at init
    assert train_float64(GPT(gpt_config(residual='mhc', mhc_res=res)), 3) > 1e-4
    symmetric = GPT(gpt_config(residual='mhc', mhc_res=res))
    with torch.no_grad():
        for m in symmetric.modules():
            if isinstance(m, ManifoldHyperConnection):
                m.b_pre.fill_(-math.log(N - 1))  # H_pre = 1/n
    assert train_float64(symmetric, 3) < 1e-12


@pytest.mark.parametrize('residual', ['hc', 'mhc'])
def test_each_sublayer_computes_its_coefficients_once(gpt_config, residual, monkeypatch):
    """One pass of the coefficients per sublayer, forward and backward together: HC's weights, and
    mHC's Sinkhorn projection."""
    import model as model_module
    net = GPT(gpt_config(residual=residual, n_layer=2))
    calls = []
    for m in net.modules():
        if isinstance(m, HyperConnection):
            monkeypatch.setattr(m, 'coefficients', lambda H, f=m.coefficients, m=m: calls.append(m) or f(H))
    projections = []
    monkeypatch.setattr(model_module, 'sinkhorn', lambda *a: projections.append(1) or sinkhorn(*a))
    idx = torch.randint(11, (2, 16))
    net(idx, idx)[1].backward()
    rules = [m for m in net.modules() if isinstance(m, HyperConnection)]
    assert len(rules) == 4 and calls == rules
    assert len(projections) == (4 if residual == 'mhc' else 0)


def saved_bytes(net, idx):
    """Bytes that one forward of net keeps for its backward, each storage once, but the parameters'."""
    params, seen = {p.untyped_storage().data_ptr() for p in net.parameters()}, {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = net(idx, idx)[1]
    return loss, sum(seen.values())


@pytest.mark.parametrize('variant', ['hc', 'mhc-sinkhorn', 'mhc-identity'])
def test_recomputation_gives_the_same_gradients_and_keeps_less(gpt_config, variant):
    """hc_recompute ([mHC] Sec. 4.3): the coefficients and the mixing computed again in backward,
    the same loss and gradients in float64, and less kept for backward."""
    results = []
    for recompute in (False, True):
        torch.manual_seed(0)
        net = GPT(gpt_config(n_layer=2, hc_recompute=recompute, **WIDE[variant])).double()
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.1 * torch.randn_like(p))
        loss, kept = saved_bytes(net, torch.arange(16).remainder(11).view(1, 16))
        loss.backward()
        results.append((loss, kept, [p.grad for p in net.parameters()]))
    (loss, kept, grads), (loss_r, kept_r, grads_r) = results
    torch.testing.assert_close(loss_r, loss, rtol=1e-12, atol=0)
    for a, b in zip(grads, grads_r):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    assert kept_r < kept


def test_mhc_mixing_is_doubly_stochastic_at_init_and_after_training(gpt_config):
    """Rows sum to 1 to float32 rounding (Sinkhorn-Knopp's last step normalises them), columns to
    within what the paper's 20 rounds reach near the identity (3e-2 after 30 steps at this large
    learning rate: Sinkhorn-Knopp converges slowly there), every entry of H_res, H_pre and H_post
    non-negative. Started near I (mhc_res_init=8), where Sinkhorn-Knopp's columns converge the slowest."""
    torch.manual_seed(0)
    cfg = configure.load(['--residual=mhc', '--mhc_res_init=8', '--n_layer=2', '--n_head=2', '--n_embd=16',
                          '--vocab_size=11', '--block_size=16', '--learning_rate=3e-2', '--weight_decay=0'])
    model = GPT(configure.model_config(cfg))
    opt = optim.make_optimizer(model, cfg, 'cpu')
    x = torch.randint(11, (8, 16))
    for step in range(31):
        if step % 15 == 0:
            for rule in (m for m in model.modules() if isinstance(m, ManifoldHyperConnection)):
                H = copied(torch.randn(8, 16, D), N)
                pre, post, res = rule.coefficients(H)
                assert (res.sum(-1) - 1).abs().max() < 4e-7
                assert (res.sum(-2) - 1).abs().max() < 5e-2
                assert res.min() >= 0 and pre.min() >= 0 and post.min() >= 0
        optim.train_step(model, opt, optim.StepScaler('cpu', 'float32'), lambda: (x, torch.roll(x, -1, 1)), 1, 1.0,
                         nullcontext())
    assert any(m.phi.abs().max() > 0 for m in model.modules() if isinstance(m, ManifoldHyperConnection))  # it trained


def constraint_holds(res, M):
    """Whether H_res M (..., n, n) has its constraint's defining property, in float64."""
    eye = torch.eye(N, dtype=M.dtype).expand_as(M)
    rows, cols = (M.sum(-1) - 1).abs().max(), (M.sum(-2) - 1).abs().max()
    return {'sinkhorn': rows < 1e-14 and cols < 5e-2 and M.min() >= 0,  # columns: 20 rounds bring them to 3.4e-2 here
            'permutation': rows < 1e-14 and cols < 1e-14 and M.min() >= 0,  # exactly doubly stochastic
            'cayley': torch.allclose(M.mT @ M, eye, rtol=0, atol=1e-14) and torch.allclose(
                torch.linalg.det(M), torch.ones(M.shape[:-2], dtype=M.dtype), rtol=0, atol=1e-13)}[res]


@pytest.mark.parametrize('res', [r for r in MIXINGS if r != 'identity'])
def test_each_h_res_constraint_holds_in_float64(res):
    """Each mhc_res's defining property, per token, with every coefficient drawn away from its
    initial value: doubly stochastic for sinkhorn (rows exactly, columns as close as its rounds
    bring them) and for permutation (exactly: a convex combination of permutation matrices);
    orthogonal with determinant 1 for cayley. And the identity mixes nothing."""
    torch.manual_seed(0)
    rule = randomised(ManifoldHyperConnection(D, N, 1, True, 20, res))
    with torch.no_grad():
        rule.a_res.fill_(1.0)  # coefficients that vary from token to token
        _, _, M = rule.coefficients(torch.randn(3, 7, N, D, dtype=torch.float64))
    assert M.shape == (3, 7, N, N) and M.std(dim=(0, 1)).max() > 1e-2
    assert constraint_holds(res, M)
    identity = ManifoldHyperConnection(D, N, 1, True, 20, 'identity').double()  # and the identity mixes nothing
    H = torch.randn(3, 7, N, D, dtype=torch.float64)
    assert identity.coefficients(H)[2] is None and torch.equal(sublayer(identity, H, 0 * H[..., 0, :])[1], H)


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
        dynamic = (rule.W,) if residual == 'hc' else (rule.phi,)
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
        ours.W.copy_(torch.cat([theirs.dynamic_alpha_fn, theirs.dynamic_beta_fn[:, None]], 1))
        ours.s_alpha.copy_(theirs.dynamic_alpha_scale.reshape(1))
        ours.s_beta.copy_(theirs.dynamic_beta_scale.reshape(1))
    folded = H.permute(0, 2, 1, 3).reshape(2 * N, 5, D)
    branch_input, add_residual = theirs(folded)
    expected = add_residual(u).reshape(2, N, 5, D).permute(0, 2, 1, 3)
    for a, b in zip(sublayer(ours, H, u), (branch_input, expected)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)

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
    expected = add_residual(u).reshape(2, N, 5, D).permute(0, 2, 1, 3)
    for a, b in zip(sublayer(ours, H, u), (branch_input, expected)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert math.isfinite(expected.abs().max().item())
