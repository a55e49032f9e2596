"""The rules that look across depth (Deep Delta Learning, Attention Residuals, DenseFormer) and the speedruns'
stream anchors (x0_mix), against float64 transcriptions of their papers' equations written here from the papers,
with their defining properties: DDL's reflection keeps ||x||, AttnRes at init reads the uniform mean and is the
pre-norm additive model, DenseFormer at init is the plain transformer, x0_mix from (1, 0) is the rule it mixes into;
and causality and decoding through the DecodeState, for each."""

import math

import pytest
import torch
import torch.nn.functional as F

from model import GPT, DecodeState, DeltaUpdate

ARCH = dict(norm='rmsnorm', init='sigma', tie_weights=False)  # the CPU recipe's


def drawn(model, scale=0.3):
    """model in float64 with every parameter drawn away from its initial value."""
    model = model.double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model


def embeddings(model, idx):
    return model.wte(idx) + model.wpe(torch.arange(idx.shape[1]))


def sublayers(model):
    """(the rule, the norm, the branch) of each sublayer in order."""
    for b in model.blocks:
        yield b.update_attn, b.ln_1, b.attn
        yield b.update_mlp, b.ln_2, b.mlp


def ddl_step(x, u, w_beta, b_beta, w_v, eps):
    """[DDL] Eq. 2.2 with d_v = 1 and App. A.1's k, beta and v, per token."""
    out = torch.empty_like(x)
    for t in range(x.shape[0]):
        c = x[t] / torch.sqrt((x[t] ** 2).mean() + torch.finfo(x.dtype).eps)
        k = u[t] / torch.sqrt(u[t] @ u[t] + eps ** 2)
        beta = 2 / (1 + torch.exp(-(w_beta @ c + b_beta)))
        out[t] = x[t] + beta * (w_v @ c - k @ x[t]) * k
    return out


def test_ddl_computes_its_papers_delta_rule(gpt_config):
    torch.manual_seed(0)
    rule = drawn(DeltaUpdate(16, 1.0, 1e-5))
    x, u = torch.randn(7, 16, dtype=torch.float64), torch.randn(7, 16, dtype=torch.float64)
    with torch.no_grad():
        expected = ddl_step(x, u, rule.w_beta, rule.b_beta, rule.w_v, 1e-5)
        torch.testing.assert_close(rule(x, u), expected, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x, u: rule(x, u), (x[:2].requires_grad_(), u[:2].requires_grad_()))


def test_ddl_at_beta_2_with_no_value_reflects_and_at_beta_1_projects():
    """beta = 2 sigmoid(inf) = 2 and v = 0: x - 2 <k, x> k, the Householder reflection, which keeps ||x|| and undoes
    itself; beta = 1: <k, x_next> = v exactly ([DDL] Eq. 2.3)."""
    torch.manual_seed(0)
    rule = DeltaUpdate(16, 1.0, 0.0).double()
    x, u = torch.randn(5, 16, dtype=torch.float64), torch.randn(5, 16, dtype=torch.float64)
    with torch.no_grad():
        rule.w_beta.zero_(), rule.w_v.zero_(), rule.b_beta.fill_(math.inf)
        once = rule(x, u)
        torch.testing.assert_close(once.norm(dim=-1), x.norm(dim=-1), rtol=1e-14, atol=0)
        torch.testing.assert_close(rule(once, u), x, rtol=1e-13, atol=1e-13)
        rule.b_beta.zero_(), rule.w_v.normal_()
        k, v = F.normalize(u, dim=-1), F.rms_norm(x, (16,)) @ rule.w_v
        torch.testing.assert_close((rule(x, u) * k).sum(-1), v, rtol=1e-13, atol=1e-13)


def attnres_reference(model, idx):
    """[AttnRes] Eq. 2-6, token by token: each sublayer reads softmax_i(w . RMSNorm(v_i)) over its sources, the
    embeddings, the completed blocks' sums and the current block's partial sum; the output read by one more query."""
    S = model.config.options.attnres_block
    x = embeddings(model, idx)  # (B, T, d)
    blocks, partial = [x], None

    def read(rule, sources):
        if rule.query is None:  # the first sublayer: its one source weighs 1
            return sources[0]
        V = torch.stack(sources)  # (n, B, T, d)
        logits = (V / torch.sqrt((V ** 2).mean(-1, keepdim=True) + torch.finfo(V.dtype).eps) * rule.norm.weight
                  * rule.query).sum(-1)
        a = torch.exp(logits) / torch.exp(logits).sum(0)
        return (a.unsqueeze(-1) * V).sum(0)
    for l, (rule, norm, branch) in enumerate(sublayers(model)):
        u = branch(norm(read(rule, blocks + ([] if partial is None else [partial]))))
        partial = u if partial is None else partial + u
        if (l + 1) % S == 0:
            blocks.append(partial)
            partial = None
    h = read(model.read_out, blocks + ([] if partial is None else [partial]))
    return model.lm_head(model.ln_f(h))


def denseformer_reference(model, idx):
    """[DenseFormer] Sec. 3: X_0 the embeddings; X_i = block i (additive) of Y_(i-1); Y_i = sum_j alpha_(i,j) X_j."""
    X = [embeddings(model, idx)]
    y = X[0]
    for b in model.blocks:
        y = y + b.attn(b.ln_1(y))
        X.append(y + b.mlp(b.ln_2(y)))
        y = sum(a * x for a, x in zip(b.update_mlp.alpha, X))
    return model.lm_head(model.ln_f(y))


def anchored_reference(model, idx):
    """The stream anchors (modded-nanogpt, nanochat): x <- a x + b RMSNorm(x0) before each additive block."""
    x = x0 = embeddings(model, idx)
    for b in model.blocks:
        x = b.anchor.resid * x + b.anchor.x0 * x0 / torch.sqrt((x0 ** 2).mean(-1, keepdim=True) + 2.0 ** -52)
        x = x + b.attn(b.ln_1(x))
        x = x + b.mlp(b.ln_2(x))
    return model.lm_head(model.ln_f(x))


@pytest.mark.parametrize('keys,reference', [
    (dict(residual='attnres'), attnres_reference), (dict(residual='attnres', attnres_block=3), attnres_reference),
    (dict(residual='attnres', attnres_block=2), attnres_reference),
    (dict(residual='denseformer'), denseformer_reference),
    (dict(residual='additive', x0_mix='nanochat'), anchored_reference)], ids=['attnres', 'attnres-block3',
                                                                             'attnres-block2', 'denseformer', 'x0_mix'])
def test_each_depth_rule_computes_its_papers_equations(gpt_config, keys, reference):
    """Every query, weight and scalar drawn away from its initial value; three blocks (six sublayers), so that a
    block of 3 sublayers ends inside one and a block of 2 ends with each."""
    torch.manual_seed(0)
    model = drawn(GPT(gpt_config(n_layer=3, **ARCH, **keys)))
    idx = torch.randint(11, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], reference(model, idx), rtol=1e-10, atol=1e-10)


def sources(sublayer, block):
    """How many sources an AttnRes read at this sublayer (2 n_layer: the read-out) averages at init: the embeddings,
    each completed block of `block` sublayers, and the current one's partial sum."""
    return 1 + sublayer // block + (1 if sublayer % block else 0)


GPT2_BLOCK = dict(norm='layernorm', init='gpt2', tie_weights=True)  # LayerNorm of eps 1e-5


@pytest.mark.parametrize('arch', [ARCH, GPT2_BLOCK], ids=['rmsnorm-sigma', 'gpt2-block'])
@pytest.mark.parametrize('keys', [dict(residual='attnres'), dict(residual='attnres', attnres_block=4),
                                  dict(residual='denseformer'), dict(residual='additive', x0_mix='identity'),
                                  dict(residual='orthogonal', x0_mix='identity'),
                                  dict(residual='ddl', x0_mix='identity')],
                         ids=['attnres', 'attnres-block4', 'denseformer', 'x0-additive', 'x0-orthogonal', 'x0-ddl'])
def test_at_init_each_is_the_model_it_extends(gpt_config, keys, arch):
    """With the same weights and each block's own norms and eps: DenseFormer's identity weights and x0_mix's (1, 0)
    leave their rule's model as it is. AttnRes with zero queries reads the uniform mean of its n sources, the additive
    stream x / n, and a norm reads x / n as it reads x with its eps times n^2 (norm(x / n; eps) = norm(x; n^2 eps),
    RMSNorm and LayerNorm alike): it is the additive model whose pre-norms have those larger eps, exactly."""
    torch.manual_seed(0)
    base = {k: v for k, v in keys.items() if k != 'x0_mix'} if 'x0_mix' in keys else dict(residual='additive')
    plain = GPT(gpt_config(n_layer=3, **arch, **base)).double()
    model = GPT(gpt_config(n_layer=3, **arch, **keys)).double()
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(0.1 * torch.randn_like(p))
        missing = model.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert all('read_out' in k or 'update_' in k or 'anchor' in k for k in missing)
    if keys['residual'] == 'attnres':
        block = keys.get('attnres_block', 1)
        norms = [n for b in plain.blocks for n in (b.ln_1, b.ln_2)] + [plain.ln_f]
        for sublayer, norm in enumerate(norms):
            norm.eps = (norm.eps or torch.finfo(torch.float64).eps) * sources(sublayer, block) ** 2
    idx = torch.randint(11, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], plain(idx)[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('arch,n_layer,far', [(ARCH, 4, False), (GPT2_BLOCK, 4, True), (GPT2_BLOCK, 12, True)],
                         ids=['rmsnorm-sigma-4', 'gpt2-block-4', 'gpt2-block-12'])
def test_how_far_attnres_starts_from_the_additive_model(gpt_config, arch, n_layer, far):
    """docs/rules.md's sizes, in float32: unit-variance embeddings (the sigma init) dwarf n^2 eps, and AttnRes starts
    where additive does, to rounding; GPT-2's N(0, 0.02) embeddings (variance 8e-4) do not beside LayerNorm's 1e-5
    n^2, and the logits at init differ by tenths."""
    torch.manual_seed(0)
    cfg = dict(n_layer=n_layer, n_head=2, n_embd=64, block_size=32, vocab_size=65, **arch)
    plain, model = GPT(gpt_config(residual='additive', **cfg)), GPT(gpt_config(residual='attnres', **cfg))
    model.load_state_dict(plain.state_dict(), strict=False)
    idx = torch.randint(65, (2, 32))
    with torch.no_grad():
        gap = (model(idx)[0] - plain(idx)[0]).abs().max().item()
    assert gap > 0.1 if far else gap < 1e-4


def test_attnres_with_zero_queries_reads_the_uniform_mean_of_its_sources():
    from model import AttentionResidual, Depth, Sublayer
    rule = AttentionResidual(16, 3).double()
    sources = [torch.randn(2, 5, 16, dtype=torch.float64) for _ in range(4)]
    depth = Depth(sources[0])
    for v in sources[1:]:
        depth.append(v)
    read = rule.prepare(sources[0], Sublayer(depth=depth))
    torch.testing.assert_close(read, sum(sources) / 4, rtol=1e-14, atol=1e-14)


def test_the_anchors_start_where_their_codebases_do(gpt_config):
    model = GPT(gpt_config(n_layer=4, x0_mix='nanochat'))
    values = [(b.anchor.resid.item(), b.anchor.x0.item()) for b in model.blocks]
    assert values[0] == pytest.approx((1.15, 0.20)) and values[-1] == pytest.approx((1.05, 0.05))
    assert all(b.anchor is None for b in GPT(gpt_config(n_layer=2)).blocks)


@pytest.mark.parametrize('residual', ['rotation', 'ngpt', 'hc', 'mhc', 'attnres', 'denseformer'])
def test_x0_mix_is_refused_where_the_stream_is_not_one_free_vector(gpt_config, residual):
    with pytest.raises(ValueError, match=f"x0_mix='nanochat' mixes the embeddings into the stream, which residual="
                                         f"'{residual}' does not allow .* use x0_mix='off', or residual additive or "
                                         f"orthogonal or ddl"):
        gpt_config(residual=residual, x0_mix='nanochat')


def test_ddl_options_are_checked(gpt_config):
    with pytest.raises(ValueError, match=r"ddl_beta_init=2.0 must lie in \(0, 2\)"):
        gpt_config(residual='ddl', ddl_beta_init=2.0)
    with pytest.raises(ValueError, match='attnres_block=0 must be at least 1'):
        gpt_config(residual='attnres', attnres_block=0)


DEPTH = [dict(residual='ddl'), dict(residual='attnres'), dict(residual='attnres', attnres_block=3),
         dict(residual='denseformer'), dict(residual='additive', x0_mix='nanochat'),
         dict(residual='ddl', x0_mix='identity', qkv='cayley')]
IDS = ['ddl', 'attnres', 'attnres-block3', 'denseformer', 'x0_mix', 'ddl-x0-cayley']


@pytest.mark.parametrize('keys', DEPTH, ids=IDS)
def test_each_is_causal_and_decodes_through_the_state_as_one_forward(gpt_config, keys):
    """No position sees a later one; the depth mixing is per position, so a DecodeState holding only attention's
    keys and values gives one full forward's logits, in pieces and after the window moves on, in float64."""
    torch.manual_seed(0)
    model = drawn(GPT(gpt_config(n_layer=3, **keys)), 0.1).eval()
    idx = torch.randint(11, (2, 16))
    changed = idx.clone()
    changed[:, 9:] = torch.randint(11, (2, 7))
    with torch.no_grad():
        full = model(idx)[0]
        torch.testing.assert_close(model(changed)[0][:, :9], full[:, :9], rtol=0, atol=1e-12)
        state = DecodeState(16)
        pieces = torch.cat([model(idx[:, a:b], cache=state)[0] for a, b in ((0, 5), (5, 6), (6, 16))], 1)
        torch.testing.assert_close(pieces, full, rtol=0, atol=1e-10)
        state.pos.zero_()  # a new window, read into the same buffers
        torch.testing.assert_close(model(idx[:, 4:12], cache=state)[0], model(idx[:, 4:12])[0], rtol=0, atol=1e-10)
