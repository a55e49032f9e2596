"""The measurements across depth of orthogpt/diagnostics.py (docs/rules.md, "Diagnostics across depth"): the wide
rules' mixing gains ([mHC] Sec. 3.1) against float64 loops over explicit matrices and the model's own forward, the
stream map's gain against the full Jacobian's singular values, the gradient magnitudes against autograd, and what
the depth rules weigh, at their known values and against the rules' own forward."""

import math

import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from model import GPT, DeltaUpdate
from orthogpt import diagnostics
from orthogpt.diagnostics import MIXING_GAINS as MIXING

TINY = dict(n_layer=1, n_head=1, n_embd=4, block_size=4)  # a Jacobian of 8 x 8 on a sequence of 2 tokens


def drawn(model, scale=0.3):
    """model in float64, every parameter moved off its initial value by N(0, scale^2)."""
    params = list(model.double().parameters())
    flat = parameters_to_vector(params)
    vector_to_parameters(flat + scale * torch.randn_like(flat), params)
    return model


def zero_branches(model):
    """Every branch writes u = 0: the attention's and the MLP's output projections zeroed (no biases)."""
    with torch.no_grad():
        for b in model.blocks:
            b.attn.c_proj.weight.zero_(), b.mlp.c_proj.weight.zero_()
    return model


def found_mixings(model, idx):
    """Each sublayer's H_res (tokens, n, n) of a forward on idx, as diagnostics.mixings collects them."""
    with diagnostics.mixings(model) as found, torch.no_grad():
        model(idx)
    return found


def loop_gains(m):
    """[mHC]'s gains of one matrix m (n, n) applied as x <- m x, in plain loops: the largest and the smallest
    |row sum|, the largest |log |row sum|| and the largest sum of a row's |entries|, then the same of the columns."""
    n, gains = m.shape[0], []
    for entries in ([[m[i, j].item() for j in range(n)] for i in range(n)],
                    [[m[i, j].item() for i in range(n)] for j in range(n)]):
        sums = [sum(row) for row in entries]
        gains += [max(abs(s) for s in sums), min(abs(s) for s in sums), max(abs(math.log(abs(s))) for s in sums),
                  max(sum(abs(e) for e in row) for row in entries)]
    return gains


def composite(matrices, l):
    """M_last ... M_(l+1) M_l, multiplied out from M_l: what carries the copies entering sublayer l to the end."""
    product = torch.eye(matrices[0].shape[0], dtype=torch.float64)
    for m in matrices[l:]:
        product = m @ product
    return product


def over_tokens(per_token):
    """The gains of the tokens (tokens, 8) as the log records them: the mean of the sizes, the max of the logs."""
    g = torch.tensor(per_token, dtype=torch.float64)
    return torch.stack([g[:, k].max() if k % 4 == 2 else g[:, k].mean() for k in range(8)])


@pytest.mark.parametrize('keys', [dict(residual='mhc', mhc_res='sinkhorn', mhc_sinkhorn_iters=2),
                                  dict(residual='mhc', mhc_res='cayley'), dict(residual='hc')],
                         ids=['sinkhorn', 'cayley', 'hc'])
def test_mixing_gains_against_a_float64_loop(gpt_config, keys):
    """Per token, each sublayer's H_res and the composite from it to the last, as loops over the explicit matrices;
    means over the tokens. Sinkhorn's rows sum to 1, so its forward gains are 1 to rounding, and its columns (2
    rounds, far from converged) do not; HC's and the Cayley map's composites amplify and attenuate, and their signed
    entries make the induced norm exceed the largest |sum|, which it equals for Sinkhorn's nonnegative entries."""
    torch.manual_seed(0)
    model = GPT(gpt_config(**keys)).double()
    with torch.no_grad():  # H_res far from I, and from token to token
        for m in diagnostics.rules(model):
            (m.phi if keys['residual'] == 'mhc' else m.W).normal_(0, 0.3)
            (m.a_res if keys['residual'] == 'mhc' else m.s_alpha).fill_(1.0)
    found = found_mixings(model, torch.randint(11, (2, 4)))
    gains = diagnostics.mixing_gains(found)
    assert gains.shape == (4, len(diagnostics.MIXING_GAINS))
    for l in range(4):
        tokens = range(found[l].shape[0])
        expected = torch.cat([over_tokens([loop_gains(found[l][t]) for t in tokens]),
                              over_tokens([loop_gains(composite([m[t] for m in found], l)) for t in tokens])])
        torch.testing.assert_close(gains[l], expected, rtol=1e-12, atol=1e-12)
    fwd, bwd = (gains[:, [MIXING.index(f'comp_{way}_{size}') for size in ('max', 'min', 'norm')]].T
                for way in ('fwd', 'bwd'))
    if keys.get('mhc_res') == 'sinkhorn':
        torch.testing.assert_close(fwd, torch.ones(3, 4, dtype=torch.float64), rtol=1e-12, atol=0)
        assert bwd[0].min() > 1.05  # the columns: a gradient's gain
        torch.testing.assert_close(bwd[2], bwd[0], rtol=1e-12, atol=0)
    else:
        assert fwd[0].max() > 1.05 and fwd[1].min() < 0.95  # amplification and attenuation
        assert (fwd[2] > fwd[0] * 1.01).any()


def test_wide_gains_follow_the_models_forward(gpt_config):
    """HC with static A_r drawn far from I and branches that write nothing: the copies after the last sublayer are
    P H_0, P = M_3 M_2 M_1 M_0 with M = A_r^T ([HC] Eq. 3-5), so rows are forward: the record's gains are P's row
    and column sums, and the stream map x_l -> x_end is P_l (x) I, whose largest singular value is P_l's."""
    torch.manual_seed(0)
    model = zero_branches(GPT(gpt_config(residual='hc', hc_dynamic=False, n_embd=4)).double())
    with torch.no_grad():
        for m in diagnostics.rules(model):
            m.static_alpha[:, 1:] += 0.4 * torch.randn(4, 4, dtype=torch.float64)
    streams = []
    idx = torch.randint(11, (1, 2))
    with diagnostics.hooked(model.blocks[0].register_forward_pre_hook(lambda m, args: streams.append(args[0])),
                            diagnostics.stream_end(model, streams.append)):
        found = found_mixings(model, idx)
    M = [m.static_alpha[:, 1:].T.detach() for m in diagnostics.rules(model)]
    torch.testing.assert_close(streams[1], composite(M, 0) @ streams[0], rtol=1e-12, atol=1e-12)
    gains = diagnostics.mixing_gains(found)
    for l in range(4):
        expected = loop_gains(M[l]) + loop_gains(composite(M, l))
        torch.testing.assert_close(gains[l], torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    sigma = torch.stack([torch.linalg.svdvals(composite(M, l))[0] for l in range(4)])
    torch.testing.assert_close(diagnostics.stream_gains(model, idx)[:, 0], sigma, rtol=1e-9, atol=0)


def test_mhc_identity_gains_are_one(gpt_config):
    """mhc_res='identity' never mixes: with branches that write nothing, the copies leave the last sublayer as they
    entered the first, and every row and column sums to 1 exactly, each sublayer's and the composite."""
    model = zero_branches(GPT(gpt_config(residual='mhc', mhc_res='identity'))).double()
    streams, idx = [], torch.randint(11, (2, 4))
    with diagnostics.hooked(model.blocks[0].register_forward_pre_hook(lambda m, args: streams.append(args[0])),
                            diagnostics.stream_end(model, streams.append)):
        gains = diagnostics.mixing_gains(found_mixings(model, idx))
    assert torch.equal(streams[0], streams[1])
    assert gains.tolist() == [[1.0, 1.0, 0.0, 1.0] * 4] * 4


def exact_jacobian(model, idx, l):
    """(x_l, J) of the stream map x_l -> x_end (diagnostics.stream_site, stream_end), J from autograd (N, N)."""
    seen = []

    def keep(x):
        seen.append(x.detach())
        return x
    with diagnostics.hooked(diagnostics.stream_site(model, l, keep)), torch.no_grad():
        model(idx)

    def end(x):
        out = []
        with diagnostics.hooked(diagnostics.stream_site(model, l, lambda _: x),
                                diagnostics.stream_end(model, out.append)):
            model(idx)
        return out[0]
    J = torch.autograd.functional.jacobian(end, seen[0])
    return seen[0], J.reshape(-1, seen[0].numel())


@pytest.mark.parametrize('keys', [dict(residual='mhc', hc_rate=2, n_embd=2), dict(residual='attnres'),
                                  dict(residual='denseformer'), dict(residual='ddl'), dict(residual='rotation')],
                         ids=lambda k: k['residual'])
def test_stream_gain_against_the_full_jacobian(gpt_config, keys):
    """float64, every parameter drawn: with as many Lanczos steps as J has columns the largest singular value
    exactly; at the default stop a lower bound within 0.1%; the root mean square ||J v_0|| / ||v_0|| at the start."""
    torch.manual_seed(0)
    model = drawn(GPT(gpt_config(**{**TINY, **keys}))).eval()
    idx = torch.randint(11, (1, 2))
    x, _ = exact_jacobian(model, idx, 0)
    full, default = diagnostics.stream_gains(model, idx, x.numel(), 0), diagnostics.stream_gains(model, idx)
    for l in range(2):
        x, J = exact_jacobian(model, idx, l)
        sigma, v = torch.linalg.svdvals(J)[0], diagnostics.start(x).flatten()
        torch.testing.assert_close(full[l], torch.stack([sigma, (J @ v).norm() / v.norm()]), rtol=1e-9, atol=0)
        assert 0.999 * sigma < default[l, 0] <= sigma * (1 + 1e-12)


def test_stream_gain_where_the_top_singular_values_crowd(gpt_config):
    """A J of 256 columns whose largest singular values lie within a few % of each other, where a fixed 5 Lanczos
    steps read the largest 4% low: the default stop (a step that raises it by under 1e-4) is within 0.1%."""
    torch.manual_seed(0)
    model = drawn(GPT(gpt_config(n_layer=2, n_embd=16, n_head=2, block_size=16))).eval()
    idx = torch.randint(11, (1, 16))
    sigma = torch.stack([torch.linalg.svdvals(exact_jacobian(model, idx, l)[1])[0] for l in range(4)])
    assert (diagnostics.stream_gains(model, idx, 5, 0)[:, 0] < 0.97 * sigma).any()
    gains = diagnostics.stream_gains(model, idx)[:, 0]
    assert (gains > 0.999 * sigma).all() and (gains <= sigma * (1 + 1e-12)).all()


@pytest.mark.parametrize('keys,gain', [(dict(residual='additive'), 1.0), (dict(residual='rotation'), 1.0),
                                       (dict(residual='denseformer'), 1.0), (dict(residual='attnres'), 1 / 5)],
                         ids=lambda k: k['residual'] if isinstance(k, dict) else '')
def test_stream_gain_known_values(gpt_config, keys, gain):
    """Branches that write nothing, at init: the additive stream, rotation's and DenseFormer's (identity weights)
    carry x_l to the end unchanged, J = I; Attention Residuals' output reads the uniform mean of 2L + 1 = 5 sources,
    of which x_l is one, J = I / 5. Every singular value is the gain: the largest and the root mean square."""
    model = zero_branches(GPT(gpt_config(**keys))).double()
    gains = diagnostics.stream_gains(model, torch.randint(11, (2, 5)))
    torch.testing.assert_close(gains, torch.full((4, 2), gain, dtype=torch.float64), rtol=1e-12, atol=0)


@pytest.mark.parametrize('training', [True, False])
def test_a_dynamics_record_leaves_the_model_in_its_mode_and_returns_numbers(gpt_config, training):
    """The record measures in eval mode and gives the model back in the mode it was given in (a model under
    evaluation stays so); the stream's gains come back as numbers, holding no graph."""
    model = GPT(gpt_config(residual='attnres', dropout=0.1)).train(training)
    idx = torch.randint(11, (2, 8))
    diagnostics.dynamics_record(model, idx, 0, torch.roll(idx, -1, 1))
    assert all(m.training == training for m in model.modules())
    assert not diagnostics.stream_gains(model, idx, 2).requires_grad


def test_stream_gains_run_the_rules_own_pytorch(gpt_config):
    """Forward-mode AD runs through the rule's own PyTorch: with the fused kernels (Triton's interpreter on a CPU)
    and hc_recompute asked for, the gains of the same model without them, and the options back as they were."""
    pytest.importorskip('triton')
    torch.manual_seed(0)
    plain = GPT(gpt_config(residual='mhc', hc_kernels='torch', n_layer=1))
    fused = GPT(gpt_config(residual='mhc', hc_kernels='triton', hc_recompute=True, n_layer=1))
    fused.load_state_dict(plain.state_dict())
    idx = torch.randint(11, (1, 4))
    torch.testing.assert_close(diagnostics.stream_gains(fused, idx, 1), diagnostics.stream_gains(plain, idx, 1))
    assert {(m.kernels, m.recompute) for m in diagnostics.rules(fused)} == {('triton', True)}


@pytest.mark.parametrize('residual', ['additive', 'ddl', 'attnres'])
def test_magnitudes_are_the_autograd_gradients(gpt_config, residual):
    """Each update's output norm and the gradients of the loss at its output and at its branch output, against
    retain_grad in float64; no parameter's .grad touched. Attention Residuals' output, the sources' sum, reaches
    no loss: NaN."""
    torch.manual_seed(0)
    model = drawn(GPT(gpt_config(residual=residual)), 0.05).eval()
    idx, targets = torch.randint(11, (2, 6)), torch.randint(11, (2, 6))
    measured = diagnostics.magnitudes(model, idx, targets)
    assert all(p.grad is None for p in model.parameters())
    outs, branches = [], []

    def keep(module, args, out):
        args[1].retain_grad(), out.retain_grad()
        outs.append(out), branches.append(args[1])
    with diagnostics.hooked(*[m.register_forward_hook(keep) for m in diagnostics.rules(model)]):
        model(idx, targets)[1].backward()
    norm = lambda t: math.nan if t is None else t.detach().norm(dim=-1).mean()  # noqa: E731
    expected = torch.tensor([[norm(x), norm(x.grad), norm(u.grad)] for x, u in zip(outs, branches)],
                            dtype=torch.float64)
    torch.testing.assert_close(measured, expected, rtol=1e-6, atol=0, equal_nan=True)
    assert measured[:, 1].isnan().all() == (residual == 'attnres')


def pictures(model, idx):
    with diagnostics.depth_pictures(model) as found, torch.no_grad():
        model(idx)
    return found


def test_attnres_weights_at_init_and_as_the_model_reads(gpt_config):
    """At init (zero queries) every read is the uniform mean of its n sources, 1/n each, the output's of all 2L + 1;
    with drawn queries, for one token, the weighted sum of the sources is what each branch and the final norm read."""
    model = GPT(gpt_config(residual='attnres'))
    weights = pictures(model, torch.randint(11, (2, 5)))['attnres_weights']
    assert weights == [pytest.approx([1 / n] * n, rel=1e-6) for n in range(1, 6)]
    torch.manual_seed(0)
    model = drawn(model)
    sources, reads = [], []
    hooks = [m.register_forward_pre_hook(lambda m, args: sources.append(args[1])) for m in diagnostics.rules(model)]
    hooks += [n.register_forward_pre_hook(lambda m, args: reads.append(args[0]))
              for b in model.blocks for n in (b.ln_1, b.ln_2)] + [model.ln_f.register_forward_pre_hook(
                  lambda m, args: reads.append(args[0]))]
    with diagnostics.hooked(*hooks), torch.no_grad():
        idx = torch.randint(11, (1, 1))
        weights = pictures(model, idx)['attnres_weights']
        sources.insert(0, model.wte(idx) + model.wpe(torch.arange(1)))  # v_0, the embeddings
    for w, read in zip(weights, reads):
        assert sum(w) == pytest.approx(1, abs=1e-12) and (len(w) == 1 or max(w) - min(w) > 0.05)  # not uniform
        torch.testing.assert_close(sum(a * v for a, v in zip(w, sources)), read, rtol=1e-12, atol=1e-12)


def test_denseformer_weights_at_init_are_the_identity(gpt_config):
    model = GPT(gpt_config(residual='denseformer', n_layer=3))
    assert pictures(model, torch.randint(11, (2, 5))) == {'denseformer_alpha': [[0, 1], [0, 0, 1], [0, 0, 0, 1]]}


def test_ddl_beta_histogram_at_its_initial_value(gpt_config):
    """With w_beta = 0 every token's beta is ddl_beta_init, 0.35: all in the bin [0.3, 0.4), none near 0, 1 or 2."""
    model = GPT(gpt_config(residual='ddl', ddl_beta_init=0.35))
    with torch.no_grad():
        for m in diagnostics.rules(model):
            m.w_beta.zero_()
    hist = [0.0] * diagnostics.BETA_BINS
    hist[3] = 1.0
    assert pictures(model, torch.randint(11, (2, 5))) == {'ddl_beta': [hist] * 4}


def test_ddl_beta_near_its_three_regimes_falls_in_the_bins_beside_0_1_and_2(gpt_config):
    """The bins that tools/plot_dynamics.py counts as near identity, projection and reflection: the first, the two
    beside 1 and the last, each 0.1 wide."""
    model = GPT(gpt_config(residual='ddl', n_layer=2))
    betas = (0.05, 0.95, 1.05, 1.95)
    with torch.no_grad():
        for m, beta in zip(diagnostics.rules(model), betas):
            m.w_beta.zero_(), m.b_beta.fill_(math.log(beta / (2 - beta)))  # 2 sigmoid(b) = beta
    n = diagnostics.BETA_BINS
    assert pictures(model, torch.randint(11, (2, 5)))['ddl_beta'] == [
        [float(i == j) for i in range(n)] for j in (0, n // 2 - 1, n // 2, n - 1)]


def test_ddl_beta_is_the_rules_own():
    """beta recovered from the rule's forward in float64: x_next - x = beta (v - <k, x>) k, so beta =
    <x_next - x, k> / (v - <k, x>), k = u / sqrt(||u||^2 + eps^2), v = w_v . RMSNorm(x)."""
    torch.manual_seed(0)
    rule = drawn(DeltaUpdate(16, 0.7, 1e-5), 1.0)
    x, u = torch.randn(6, 16, dtype=torch.float64), torch.randn(6, 16, dtype=torch.float64)
    with torch.no_grad():
        k = u / torch.sqrt((u * u).sum(-1, keepdim=True) + 1e-10)
        v = torch.nn.functional.rms_norm(x, (16,)) @ rule.w_v
        beta = ((rule(x, u) - x) * k).sum(-1) / (v - (k * x).sum(-1))
        torch.testing.assert_close(diagnostics.ddl_beta(rule, x), beta, rtol=1e-10, atol=0)
    assert beta.max() - beta.min() > 0.1  # from token to token


def test_the_depth_figures_read_each_statistic_where_it_was_last_measured():
    """A run stopped between the stream map's gains (they come every dynamics_gain_interval): its figures draw the
    gains of the last record that has them, and the rest from the last record."""
    from tools.plot_dynamics import last_measuring
    record = lambda it, gain: {'iter': it, 'attn': {'map_max': [gain], 'cos': [0.1]},  # noqa: E731
                               'mlp': {'map_max': [gain], 'cos': [0.2]}}
    records = [record(100, None), record(200, 3.0), record(300, None)]
    assert last_measuring(records, 'map_max')['iter'] == 200
    assert last_measuring(records, 'cos')['iter'] == 300
    assert last_measuring(records[:1], 'map_max')['iter'] == 100  # never measured: the last, whose values are None
