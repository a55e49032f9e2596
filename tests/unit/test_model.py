"""GPT-level behaviour: causality, the rotation model's norms, orthogonal Q/K/V, initialisation,
decoding through the fixed-shape state, and the sampler."""

import itertools
import math

import pytest
import torch

from model import GPT, RESIDUALS, AdditiveUpdate, DecodeState, OrthogonalQKV, OrthogonalUpdate, RotationUpdate
from orthogpt import decoding
from orthogpt.maps import maps_held


def train_steps(model, steps=20, lr=1e-2, weight_decay=0.1):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    V, T = model.config.vocab_size, model.config.block_size
    for _ in range(steps):
        idx = torch.randint(V, (4, T))
        _, loss = model(idx, torch.roll(idx, -1, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


VARIANTS = [dict(residual='additive'), dict(residual='rotation'), dict(residual='ngpt'),
            dict(residual='orthogonal', ortho_mode='feature'),
            dict(residual='orthogonal', ortho_mode='global'),
            dict(residual='orthogonal', ortho_mode='global', ortho_prob=0.5),
            dict(residual='hc'), dict(residual='mhc'), dict(residual='mhc', hc_dynamic=False)]


@pytest.mark.parametrize('variant,qkv', list(itertools.product(VARIANTS, ['dense', 'cayley', 'exp'])),
                         ids=lambda v: '-'.join(map(str, v.values())) if isinstance(v, dict) else v)
@pytest.mark.parametrize('init', ['gpt2', 'sigma'])
def test_causality(variant, qkv, init, gpt_config):
    """Changing tokens at positions >= t never changes logits at positions < t."""
    model = GPT(gpt_config(qkv=qkv, init=init, tie_weights=init == 'gpt2', **variant))
    train_steps(model, steps=3)  # move off the initial weights
    idx = torch.randint(11, (3, 16))
    for t in (1, 7, 15):
        changed = idx.clone()
        changed[:, t:] = (changed[:, t:] + 1 + torch.randint(9, changed[:, t:].shape)) % 11
        torch.manual_seed(5)  # the same stochastic connections in both passes
        a, _ = model(idx)
        torch.manual_seed(5)
        b, _ = model(changed)
        assert torch.allclose(a[:, :t], b[:, :t], atol=1e-5, rtol=0), f"future leaked into t < {t}"
        assert not torch.allclose(a[:, t:], b[:, t:], atol=1e-3)


def block_norms(model, idx):
    norms = []
    hooks = [b.register_forward_hook(lambda m, inp, out: norms.extend([inp[0].norm(dim=-1), out.norm(dim=-1)]))
             for b in model.blocks]
    model(idx)
    for h in hooks:
        h.remove()
    return torch.stack(norms)


@pytest.mark.parametrize('qkv,init', [('dense', 'sigma'), ('cayley', 'sigma'), ('dense', 'gpt2')])
def test_rotation_keeps_every_block_on_the_sphere(qkv, init, gpt_config):
    cfg = gpt_config(residual='rotation', n_layer=6, n_embd=32, qkv=qkv, init=init, tie_weights=init == 'gpt2',
               sigma_w=1.0)
    model = GPT(cfg)
    # the paper's architecture: no norms in the blocks, none at the end, one weightless after the embeddings
    assert all(isinstance(b.ln_1, torch.nn.Identity) and isinstance(b.ln_2, torch.nn.Identity) for b in model.blocks)
    assert isinstance(model.ln_f, torch.nn.Identity)
    assert isinstance(model.ln_emb, torch.nn.RMSNorm) and model.ln_emb.weight is None
    assert all(isinstance(b.update_attn, RotationUpdate) for b in model.blocks)
    idx = torch.randint(11, (4, 16))
    for _ in range(2):
        norms = block_norms(model, idx)
        assert norms.shape == (12, 4, 16)
        assert (norms / math.sqrt(32) - 1).abs().max() < 1e-5
        train_steps(model, steps=30, lr=3e-2)


def test_additive_stream_is_not_normalised(gpt_config):
    """The check above can fail: an additive model's stream norm grows with depth."""
    norms = block_norms(GPT(gpt_config(n_layer=6, n_embd=32, init='sigma', tie_weights=False, sigma_w=1.0)),
                        torch.randint(11, (4, 16)))
    assert (norms / math.sqrt(32) - 1).abs().max() > 0.1


@pytest.mark.parametrize('kind', ['cayley', 'exp'])
def test_orthogonal_qkv_weights_stay_orthogonal(kind, gpt_config):
    cfg = gpt_config(qkv=kind, n_embd=32, n_head=4)
    model = GPT(cfg)
    eye = torch.eye(32)
    for step in range(2):
        for b in model.blocks:
            w = b.attn.c_attn.weight.detach().view(3, 32, 32)
            assert (w.mT @ w - eye).abs().max() < 1e-5 and (w @ w.mT - eye).abs().max() < 1e-5
        if step == 0:
            before = model.blocks[0].attn.c_attn.weight.detach().clone()
            train_steps(model, steps=20, lr=3e-2)
    assert not torch.allclose(before, model.blocks[0].attn.c_attn.weight), "the weights were trained"


@pytest.mark.parametrize('kind', ['cayley', 'exp'])
@pytest.mark.parametrize('d', [8, 40])
def test_orthogonal_maps_match_the_paper(kind, d):
    """cayley: 2 (I + A)^-1 - I with A = W - W^T ([OViT] Alg. 2), against float64; exp: the matrix
    exponential of A."""
    w = 0.3 * torch.randn(3 * d, d)
    out = OrthogonalQKV(kind)(w)
    a = w.double().view(3, d, d)
    a = a - a.mT
    eye = torch.eye(d, dtype=torch.float64)
    ref = 2 * torch.linalg.inv(eye + a) - eye if kind == 'cayley' else torch.linalg.matrix_exp(a)
    assert out.shape == w.shape
    assert (out.double() - ref.reshape(3 * d, d)).abs().max() < 1e-5


@pytest.mark.parametrize('kind', ['cayley', 'exp'])
def test_map_gradients_by_finite_differences(kind):
    """The gradient autograd derives through each map, against finite differences in float64."""
    w = (0.3 * torch.randn(3 * 6, 6, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(OrthogonalQKV(kind), (w,))


@pytest.mark.parametrize('kind', ['cayley', 'exp'])
def test_batched_maps_give_the_per_layer_loss_and_gradients(kind, monkeypatch, gpt_config):
    """All layers' maps in one batched call (training and inference) compute what each layer's
    own map computes, to float64 rounding, and the layers compute their maps again afterwards."""
    torch.manual_seed(0)
    model = train_steps(GPT(gpt_config(n_layer=3, qkv=kind)), steps=3, lr=3e-2).double()  # A away from 0
    idx = torch.randint(11, (2, 16))

    def loss_and_grads():
        model.zero_grad()
        logits, loss = model(idx, torch.roll(idx, -1, 1))
        loss.backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters()]

    ref_logits, ref_grads = loss_and_grads()
    calls = []
    for name in ('inv_ex', 'matrix_exp'):
        f = getattr(torch.linalg, name)
        monkeypatch.setattr(torch.linalg, name, lambda *a, f=f, **k: calls.append(a[0].shape) or f(*a, **k))
    with maps_held(model, grad=True):
        logits, grads = loss_and_grads()
    assert calls == [(9, 16, 16)]  # 3 layers x Q, K, V
    assert torch.allclose(logits, ref_logits, atol=1e-12)
    assert all(torch.allclose(g, r, atol=1e-12) for g, r in zip(grads, ref_grads))
    with maps_held(model), torch.no_grad():
        assert torch.allclose(model(idx)[0][:, -1], ref_logits[:, -1], atol=1e-12)
    assert len(calls) == 2
    model(idx)
    assert len(calls) == 5, "outside the context each layer computes its own map again"


def test_orthogonal_qkv_trains_the_raw_weight(gpt_config):
    model = GPT(gpt_config(qkv='cayley'))
    names = [n for n, _ in model.named_parameters() if 'c_attn' in n]
    assert names == ['blocks.0.attn.c_attn.parametrizations.weight.original',
                     'blocks.1.attn.c_attn.parametrizations.weight.original']


def test_ortho_layer_pattern(gpt_config):
    model = GPT(gpt_config(n_layer=4, residual='orthogonal', ortho_layers=(0, 2)))
    kinds = [(type(b.update_attn), type(b.update_mlp)) for b in model.blocks]
    assert kinds == [(OrthogonalUpdate,) * 2, (AdditiveUpdate,) * 2, (OrthogonalUpdate,) * 2, (AdditiveUpdate,) * 2]


def test_sigma_init_statistics(gpt_config):
    d = 256
    cfg = gpt_config(n_embd=d, n_head=4, n_layer=2, vocab_size=500, init='sigma', sigma_w=0.6, sigma_qk=1.3,
               tie_weights=False)
    model = GPT(cfg)
    block = model.blocks[0]
    qkv = block.attn.c_attn.weight
    expected = [(qkv[:2 * d], 1.3 / 16), (qkv[2 * d:], 0.6 / 16), (block.attn.c_proj.weight, 0.6 / 16),
                (block.mlp.c_fc.weight, 0.6 / 16), (block.mlp.c_proj.weight, 0.6 * math.sqrt(2 / (4 * d))),
                (model.wte.weight, 1.0)]
    for w, std in expected:
        assert abs(w.std().item() / std - 1) < 0.03
    assert isinstance(block.mlp.act, torch.nn.GELU)  # activation is its own key
    assert isinstance(GPT(gpt_config(init='sigma', tie_weights=False, activation='relu')).blocks[0].mlp.act, torch.nn.ReLU)


def test_gpt2_init_and_loss_at_init(gpt_config):
    model = GPT(gpt_config(vocab_size=50, n_embd=64, n_layer=3))
    assert abs(model.blocks[0].mlp.c_proj.weight.std().item() / (0.02 / math.sqrt(6)) - 1) < 0.05
    assert model.lm_head.weight is model.wte.weight
    idx = torch.randint(50, (8, 16))
    logits, loss = model(idx, torch.randint(50, (8, 16)))
    assert logits.shape == (8, 16, 50)
    assert abs(loss.item() - math.log(50)) < 0.1
    assert model(idx)[1] is None


def test_config_errors(gpt_config):
    with pytest.raises(ValueError, match='not divisible by n_head'):
        gpt_config(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match='tie_weights=False'):
        gpt_config(init='sigma')
    with pytest.raises(ValueError, match='out of range'):
        gpt_config(residual='orthogonal', ortho_layers=(0, 5))
    with pytest.raises(ValueError, match='exceeds block_size'):
        GPT(gpt_config())(torch.zeros(1, 17, dtype=torch.long))


def test_top_k_one_is_greedy_decoding_over_a_sliding_window(gpt_config):
    """top_k=1 takes the most likely token: each new token is the argmax of a forward over the last
    block_size tokens (shift=1, nanoGPT's sliding window), as written out by hand here."""
    model = GPT(gpt_config(residual='rotation')).eval()
    prompt = torch.randint(11, (2, 3))
    out = decoding.generate(model, prompt, 30, temperature=2.0, top_k=1, shift=1, use_cache=False)
    idx = prompt
    with torch.no_grad():
        for _ in range(30):
            logits, _ = model(idx[:, -16:])
            idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert out.shape == (2, 33) and torch.equal(out, idx)
    assert not out.is_inference()  # generated in inference mode, returned fit for training on
    with pytest.raises(ValueError, match='shift=17'):
        decoding.generate(model, torch.zeros(1, 3, dtype=torch.long), 1, shift=17)


# every rule, mHC with each constraint of H_res; with the orthogonal Q/K/V maps below
RULES = VARIANTS + [dict(residual='mhc', mhc_res=res) for res in ('identity', 'permutation', 'cayley')]


@pytest.mark.parametrize('variant', [dict(v, qkv=qkv) for v in RULES for qkv in ('dense', 'cayley')] + [
    dict(residual='orthogonal', ortho_mode='global', qkv='exp'), dict(residual='mhc', qkv='exp')],
    ids=lambda v: '-'.join(map(str, v.values())))
def test_decoding_through_the_state_gives_the_full_forward(variant, gpt_config, decodes_in_pieces):
    """Windows fed through one DecodeState in pieces, moved on twice into the same buffers, give one full
    forward's logits at every position, in float64 (decodes_in_pieces)."""
    model = GPT(gpt_config(**variant)).double()
    train_steps(model, steps=3)
    decodes_in_pieces(model.eval(), torch.randint(11, (3, 16)))


def test_the_state_keeps_its_buffers_and_its_position_on_the_device(gpt_config):
    """The buffers are allocated at the first forward and then written in place, whatever the position; the
    position is a tensor; the head can read the last position alone; past block_size is an error."""
    model = GPT(gpt_config(residual='orthogonal', ortho_mode='global')).double().eval()
    idx = torch.randint(11, (2, 16))
    state = DecodeState(16)
    with torch.no_grad():
        full, _ = model(idx)
        last, _ = model(idx[:, :9], cache=state, last=True)
        torch.testing.assert_close(last, full[:, 8:9], rtol=0, atol=1e-10)
        addresses = [t.data_ptr() for t in state.tensors()]
        assert len(addresses) == 2 * 2 + 2 * 2 * 2  # each layer's keys and values, each sublayer's two running sums
        assert all(t.shape[-2] == 16 for t in state.tensors())
        for t in range(9, 16):
            model(idx[:, t:t + 1], cache=state)
        assert state.pos.item() == 16 and torch.is_tensor(state.pos)
        with pytest.raises(RuntimeError, match='decoding past block_size=16'):
            model(idx[:, :1], cache=state)
        state.pos.zero_()
        model(idx[:, 3:5], cache=state)
    assert [t.data_ptr() for t in state.tensors()] == addresses


@pytest.mark.parametrize('variant', [dict(residual='orthogonal', ortho_mode='global', qkv='cayley'),
                                     dict(residual='ngpt'), dict(residual='hc')],
                         ids=lambda v: '-'.join(map(str, v.values())))
@pytest.mark.parametrize('shift', [1, 5])
def test_cached_generation_draws_the_same_tokens(variant, shift, gpt_config):
    """Past block_size the window moves (by one token, or five at a time); cached and uncached
    generation sample the same tokens from the same generator (every rule's state: the test above)."""
    model = GPT(gpt_config(**variant)).double()
    train_steps(model, steps=3)
    model.eval()
    prompt = torch.randint(11, (2, 4))
    runs = [decoding.generate(model, prompt, 30, top_k=8, shift=shift, use_cache=c,
                              generator=torch.Generator().manual_seed(3)) for c in (True, False)]
    assert runs[0].shape == (2, 34)
    assert torch.equal(runs[0], runs[1])


def test_generation_maps_orthogonal_weights_once(monkeypatch, gpt_config):
    model = GPT(gpt_config(qkv='cayley')).eval()
    calls = []
    inv_ex = torch.linalg.inv_ex
    monkeypatch.setattr(torch.linalg, 'inv_ex', lambda *a, **k: calls.append(a[0].shape) or inv_ex(*a, **k))
    decoding.generate(model, torch.zeros(1, 2, dtype=torch.long), 30)
    assert calls == [(3, 16, 16)] * model.config.n_layer  # each layer's maps once, not once per token


def test_a_write_in_the_old_form_and_an_unknown_compile_scope_are_refused_in_one_line(gpt_config):
    """cache.write(module, *tensors, dim) (before a block's writes were its layer's) names the new form; a
    compile_scope other than 'blocks' or 'model' names the two."""
    step = DecodeState(16).advance(2).at(0)
    with pytest.raises(TypeError, match=r'is now cache.write\(\*tensors, dim=...\): drop module'):
        step.write(AdditiveUpdate(), torch.zeros(1, 2, 4), dim=-2)
    with pytest.raises(ValueError, match="compile_scope='whole' is not one of 'blocks' | 'model'"):
        decoding.generate(GPT(gpt_config()), torch.zeros(1, 2, dtype=torch.long), 3, compile=True,
                          compile_scope='whole')


def chi_square_p(counts, probs):
    """The p-value of Pearson's chi-square test of counts (k,) against probabilities probs (k,), all positive."""
    expected = counts.sum() * probs
    statistic = ((counts - expected) ** 2 / expected).sum()
    return torch.special.gammaincc(torch.tensor((len(probs) - 1) / 2, dtype=torch.float64), statistic / 2).item()


@pytest.mark.parametrize('temperature,top_k', [(1.0, None), (0.7, None), (1.5, 4)])
def test_the_sampler_draws_what_softmax_and_multinomial_draw(temperature, top_k):
    """decoding.sample (the Gumbel-max trick, no host sync) draws token i with probability
    softmax(logits / temperature)_i over the top_k largest logits, 0 elsewhere: the distribution of
    torch.multinomial(softmax(...)). Pearson's chi-square over 40,000 draws from a seeded generator,
    with a test that rejects the distribution at temperature 1 when the sampler uses another."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], dtype=torch.float64)
    n, V = 40_000, len(logits)
    noise = torch.empty(n, V).exponential_(generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(decoding.sample(logits.expand(n, V), noise, temperature, top_k), minlength=V).double()
    kept = torch.arange(V) < (top_k or V)  # the logits are sorted: the top_k are the first
    assert counts[~kept].sum() == 0
    probs = torch.softmax(logits[kept] / temperature, -1)
    assert chi_square_p(counts[kept], probs) > 1e-3
    if temperature != 1.0:
        assert chi_square_p(counts[kept], torch.softmax(logits[kept], -1)) < 1e-6


def test_the_gated_mlp_matches_the_standard_ones_parameters_unless_asked_for_4d(gpt_config):
    """'gated' is u * SiLU(v), u and v from one matrix; by default 8/3 x n_embd wide, so that its three
    matrices hold what the standard MLP's two do (to the rounding of the width)."""
    d = 48
    count = lambda **kw: sum(p.numel() for p in GPT(gpt_config(n_embd=d, **kw)).blocks[0].mlp.parameters())  # noqa: E731
    standard, gated, wide = count(), count(mlp='gated'), count(mlp='gated', mlp_ratio=4.0)
    assert standard == 2 * d * 4 * d and gated == 3 * d * 128 and abs(gated / standard - 1) < 0.01
    assert wide == 3 * d * 4 * d  # nGPT's: 4 x n_embd, half as many parameters again
    mlp = GPT(gpt_config(n_embd=d, mlp='gated')).double().blocks[0].mlp
    x = torch.randn(3, 5, d, dtype=torch.float64)
    u, v = (x @ mlp.c_fc.weight.T).chunk(2, dim=-1)
    torch.testing.assert_close(mlp(x), (u * torch.nn.functional.silu(v)) @ mlp.c_proj.weight.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('mlp', ['standard', 'gated'])
def test_ngpt_scales_its_mlp_as_the_paper_with_either_mlp(gpt_config, mlp):
    """[nGPT] Eq. 20-21: u s_u and v s_v sqrt(d) before SiLU(v) (gated); the standard MLP's one input
    takes v's scaling, before its activation."""
    d = 16
    block = GPT(gpt_config(residual='ngpt', mlp=mlp, activation='gelu', tie_weights=False)).double().blocks[0]
    with torch.no_grad():
        block.mlp.s_uv.weight.uniform_(0.5, 2.0)
    x = torch.randn(4, d, dtype=torch.float64)
    h = (x @ block.mlp.c_fc.weight.T) * block.mlp.s_uv()
    if mlp == 'gated':
        u, v = h.chunk(2, dim=-1)
        hidden = u * torch.nn.functional.silu(v * math.sqrt(d))
    else:
        hidden = torch.nn.functional.gelu(h * math.sqrt(d))
    torch.testing.assert_close(block.mlp(x), hidden @ block.mlp.c_proj.weight.T, rtol=1e-12, atol=1e-12)


MODERN = dict(pos='rope', qk_norm=True, activation='relu2', norm='rmsnorm', norm_gain=False, logit_softcap=15.0,
              value_embeds=True, tie_weights=False, n_layer=3)  # config/modern.py's block; 3 layers: value embeds


@pytest.mark.parametrize('keys', [dict(residual=name) for name in RESIDUALS] + [
    dict(residual=name, **MODERN) for name in RESIDUALS] + [
    dict(residual='attnres', attnres_block=2), dict(residual='additive', x0_mix='nanochat'),
    dict(residual='additive', qkv='cayley')], ids=lambda k: '-'.join(map(str, k.values())))
def test_every_parameter_a_rule_creates_gets_a_gradient(gpt_config, keys):
    """A parameter that no loss reaches would count in the model's size and never train: every one, drawn away from
    its initial value (where a gate at 0 would hide what it reads), gets a nonzero gradient."""
    torch.manual_seed(0)
    model = GPT(gpt_config(**keys)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    idx = torch.randint(11, (2, 16))
    model(idx, idx)[1].backward()
    dead = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert not dead, dead
