"""The causal ablations (orthogpt/ablations.py): each switches its mechanism off exactly, on a model whose rule
parameters have all moved off their init, in float64."""

import copy

import pytest
import torch

from model import GPT, AdditiveUpdate
from orthogpt import ablations


def trained(gpt_config, **keys):
    """(a model whose every parameter moved off its init, the model as built: the rules' initial values)."""
    torch.manual_seed(0)
    fresh = GPT(gpt_config(n_layer=2, **keys)).double().eval()
    model = copy.deepcopy(fresh)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model, fresh


def streams(model):
    """The rule modules of every sublayer, each with a random stream of its shape ((2, 5, n, 16) for a wide rule)."""
    n = model.rule.copies(model.config)
    return [(m, torch.randn(2, 5, *([n] if n else []), 16, dtype=torch.float64))
            for _, _, m in ablations.rule_modules(model)]


@pytest.mark.parametrize('keys', [dict(residual='hc'), dict(residual='hc', hc_dynamic=False), dict(residual='mhc'),
                                  dict(residual='mhc', mhc_res='permutation', hc_rate=3), dict(residual='mhc',
                                  mhc_res='cayley', hc_dynamic=False)], ids=lambda k: '-'.join(map(str, k.values())))
def test_the_wide_rules_mixing_becomes_the_identity_and_their_maps_their_init(keys, gpt_config):
    model, fresh = trained(gpt_config, **keys)
    assert all(m.coefficients(H)[2] is not None for m, H in streams(model))  # mixing, learned
    mixed = copy.deepcopy(model)
    ablations.mixing_identity(mixed, fresh)
    for (m, H), (a, _) in zip(streams(model), streams(mixed)):
        mixing = a.coefficients(H)[2]
        assert mixing is None or torch.equal(mixing, torch.eye(H.shape[-2], dtype=H.dtype).expand_as(mixing))
        torch.testing.assert_close(a.coefficients(H)[:2], m.coefficients(H)[:2], rtol=1e-15, atol=0)  # read, write kept
        twin = type(a)(16, *a.twin()).double()  # the rule that the kernels' proof builds: this one
        twin.load_state_dict(a.state_dict())
        torch.testing.assert_close(twin.coefficients(H), a.coefficients(H), rtol=0, atol=0)
    frozen = copy.deepcopy(model)
    ablations.maps_at_init(frozen, fresh)
    for (m, H), (a, _), (f, _) in zip(streams(model), streams(frozen), streams(fresh)):
        read, write, mixing = a.coefficients(H)
        first, *_ = f.coefficients(H)
        torch.testing.assert_close(read, first.expand_as(read), rtol=0, atol=1e-15)  # as built, for every token
        torch.testing.assert_close(write, f.coefficients(H)[1].expand_as(write), rtol=0, atol=1e-15)
        torch.testing.assert_close(mixing, m.coefficients(H)[2], rtol=0, atol=0)  # the mixing kept


def test_uniform_depth_reads_the_mean_of_the_sources(gpt_config):
    from model import Depth, Sublayer
    model, fresh = trained(gpt_config, residual='attnres')
    ablations.uniform_depth(model, fresh)
    sources = [torch.randn(2, 5, 16, dtype=torch.float64) for _ in range(3)]
    queried = [m for _, _, m in ablations.rule_modules(model) if m.query is not None]  # not the first: one source
    for m in queried:
        depth = Depth(sources[0])
        for v in sources[1:]:
            depth.append(v)
        read = m.prepare(sources[0], Sublayer(depth=depth))
        torch.testing.assert_close(read, sum(sources) / 3, rtol=1e-14, atol=1e-14)
    assert len(queried) == 4  # the read-out too


def test_ddl_at_beta_zero_is_the_identity_and_write_only_drops_the_erase(gpt_config):
    model, fresh = trained(gpt_config, residual='ddl')
    gated, written = copy.deepcopy(model), copy.deepcopy(model)
    ablations.beta_zero(gated, fresh)
    ablations.write_only(written, fresh)
    for (m, x), (g, _), (w, _) in zip(streams(model), streams(gated), streams(written)):
        u = torch.randn_like(x)
        assert torch.equal(g(x, u), x)
        c = x / x.square().mean(-1, keepdim=True).sqrt()
        k = u / (u.square().sum(-1, keepdim=True) + m.eps ** 2).sqrt()
        beta = 2 * torch.sigmoid(c @ m.w_beta + m.b_beta)[..., None]
        v = (c @ m.w_v)[..., None]
        torch.testing.assert_close(w(x, u), x + beta * v * k, rtol=1e-12, atol=1e-12)
        erase = beta * (k * x).sum(-1, keepdim=True) * k
        torch.testing.assert_close(m(x, u), x + beta * v * k - erase, rtol=1e-12, atol=1e-12)


def test_denseformer_at_its_init_weights_and_orthogonal_with_its_parallel_part_are_their_plain_models(gpt_config):
    idx = torch.randint(11, (2, 16))
    for keys, plain in ((dict(residual='denseformer'), dict(residual='additive')),
                        (dict(residual='orthogonal'), dict(residual='additive'))):
        model, fresh = trained(gpt_config, **keys)
        other = GPT(gpt_config(n_layer=2, **plain)).double().eval()
        other.load_state_dict(model.state_dict(), strict=False)
        before = model(idx)[0]
        for f in ablations.available(model).values():
            f(model, fresh)
        torch.testing.assert_close(model(idx)[0], other(idx)[0], rtol=1e-12, atol=1e-12)
        assert not torch.allclose(before, other(idx)[0], atol=1e-3)


def test_each_rule_offers_its_own_ablations_and_a_subclass_its_parents(gpt_config, registered):
    from model import ManifoldHyperConnection
    offered = {r: sorted(ablations.available(GPT(gpt_config(residual=r)))) for r in
               ('additive', 'orthogonal', 'rotation', 'hc', 'mhc', 'ddl', 'attnres', 'denseformer')}
    assert offered == {'additive': [], 'orthogonal': ['parallel_back'], 'rotation': [],
                       'hc': ['maps_at_init', 'mixing_identity'], 'mhc': ['maps_at_init', 'mixing_identity'],
                       'ddl': ['beta_zero', 'write_only'], 'attnres': ['uniform_depth'],
                       'denseformer': ['weights_at_init']}
    registered('my_mhc', type('MyMHC', (ManifoldHyperConnection,), {}))
    assert sorted(ablations.available(GPT(gpt_config(residual='my_mhc')))) == ['maps_at_init', 'mixing_identity']
    assert not any(isinstance(m, AdditiveUpdate) for _, _, m in ablations.rule_modules(GPT(gpt_config(residual='hc'))))
