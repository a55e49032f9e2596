"""The modern block's parts (config/modern.py): RoPE, QK norm, ReLU^2, norms without gains, the logit soft-cap and
the value embeddings, each against a float64 transcription of its definition; decoding under the preset for every
rule; and what is refused."""

import math

import pytest
import torch
import torch.nn.functional as F

import configure
from configure.errors import UserError
from model import GPT, MLP, RESIDUALS, SelfAttention, ViTConfig, rotary
from orthogpt import decoding
from orthogpt.flops import lookups

MODERN = dict(pos='rope', rope_base=100000.0, qk_norm=True, activation='relu2', norm='rmsnorm', norm_gain=False,
              logit_softcap=15.0, value_embeds=True, tie_weights=False)


def roformer(x, m, base):
    """[RoFormer] Eq. 34 for one vector x (d,) at position m, float64, pairs (x_2i, x_2i+1): x_2i cos - x_2i+1 sin,
    x_2i sin + x_2i+1 cos, at the angle m base^(-2i/d)."""
    d, out = len(x), [0.0] * len(x)
    for i in range(d // 2):
        a = m * base ** (-2 * i / d)
        out[2 * i] = x[2 * i] * math.cos(a) - x[2 * i + 1] * math.sin(a)
        out[2 * i + 1] = x[2 * i] * math.sin(a) + x[2 * i + 1] * math.cos(a)
    return out


@pytest.mark.parametrize('base', [10000.0, 100000.0, 7.0])
def test_rope_is_roformers_rotation_with_the_halves_of_a_head_paired(base):
    """rotary pairs x_i with x_{i + hs/2}; read in RoFormer's order (x_2i, x_2i+1 = x_i, x_{i + hs/2}) it is Eq. 34."""
    hs, positions = 8, torch.tensor([0, 1, 5, 63, 1000])
    x = torch.randn(2, 3, len(positions), hs, dtype=torch.float64)
    order = torch.stack([torch.arange(hs // 2), torch.arange(hs // 2) + hs // 2], -1).flatten()  # RoFormer's j <- ours
    got = rotary(x, positions, base)[..., order]
    for b, h, t in ((0, 0, 0), (1, 2, 3), (0, 1, 4), (1, 0, 2)):
        want = roformer(x[b, h, t, order].tolist(), positions[t].item(), base)
        torch.testing.assert_close(got[b, h, t], torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(rotary(x, positions, base).norm(dim=-1), x.norm(dim=-1), rtol=1e-13, atol=0)


def test_attention_scores_depend_on_the_relative_position_alone():
    """<R_m q, R_n k> = <R_(m+s) q, R_(n+s) k>: shifting every position of q and k together changes no score, and a
    shift of one side alone does."""
    q, k = torch.randn(2, 4, 12, 16, dtype=torch.float64), torch.randn(2, 4, 12, 16, dtype=torch.float64)
    pos = torch.arange(12)

    def scores(pq, pk):
        return rotary(q, pq, 100.0) @ rotary(k, pk, 100.0).mT

    for s in (1, 7, 500):
        torch.testing.assert_close(scores(pos + s, pos + s), scores(pos, pos), rtol=0, atol=1e-10)
    assert not torch.allclose(scores(pos + 1, pos), scores(pos, pos), atol=1e-3)


def attention_reference(attn, x, ve, cfg):
    """SelfAttention's forward, written out in float64: q, k, v from c_attn; v += 3 sigmoid(W x[:12]) ve per head;
    RoPE; q / rms(q), k / rms(k); causal softmax(q k^T / sqrt(hs)) v; c_proj."""
    B, T, C = x.shape
    nh, hs = cfg.n_head, C // cfg.n_head
    q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in (x @ attn.c_attn.weight.T).split(C, -1))
    gate = 3 / (1 + torch.exp(-(x[..., :12] @ attn.ve_gate.weight.T)))  # (B, T, nh)
    v = v + gate.transpose(1, 2)[..., None] * ve.view(B, T, nh, hs).transpose(1, 2)
    q, k = (rotary(t, torch.arange(T), cfg.rope_base) for t in (q, k))
    q, k = (t / t.square().mean(-1, keepdim=True).add(torch.finfo(t.dtype).eps).sqrt() for t in (q, k))
    s = (q @ k.mT) / math.sqrt(hs) + torch.full((T, T), -math.inf, dtype=x.dtype).triu(1)
    return (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, C) @ attn.c_proj.weight.T


def test_attention_with_rope_qk_norm_and_value_embeddings_matches_float64(gpt_config):
    cfg = gpt_config(**MODERN, n_embd=32, n_head=4)
    attn = SelfAttention(cfg, causal=True, normalized=False, gated=True).double()
    torch.nn.init.normal_(attn.ve_gate.weight)  # gates away from their start, so that a wrong gate shows
    x, ve = torch.randn(3, 10, 32, dtype=torch.float64), torch.randn(3, 10, 32, dtype=torch.float64)
    torch.testing.assert_close(attn(x, None, ve), attention_reference(attn, x, ve, cfg), rtol=0, atol=1e-12)
    with torch.no_grad():  # a parameter-free norm: each head's q and k scaled by any positive number change nothing
        before = attn(x, None, ve)
        attn.c_attn.weight[:32].view(4, 8, 32).mul_(torch.rand(4, 1, 1, dtype=torch.float64) + 0.5)
        attn.c_attn.weight[32:64] *= 3.0
        torch.testing.assert_close(attn(x, None, ve), before, rtol=0, atol=1e-12)


def test_qk_norm_after_rope_is_the_norm_before_it():
    """RoPE keeps each head's norm, so a parameter-free RMSNorm gives the same q and k on either side of it (the order
    matters only for a gain, which this norm has none of)."""
    q, pos = torch.randn(2, 3, 9, 8, dtype=torch.float64), torch.arange(9)
    torch.testing.assert_close(F.rms_norm(rotary(q, pos, 1e4), (8,)), rotary(F.rms_norm(q, (8,)), pos, 1e4),
                               rtol=0, atol=1e-13)


def test_ngpt_normalises_q_and_k_its_own_way_under_qk_norm(gpt_config):
    """nGPT's cosine of q and k, scaled by s_qk, is its QK norm: qk_norm adds no second one."""
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    outs = []
    for qk_norm in (False, True):
        torch.manual_seed(0)
        attn = SelfAttention(gpt_config(residual='ngpt', qk_norm=qk_norm), True, normalized=True).double()
        outs.append(attn(x))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_relu2_mlp_matches_float64(gpt_config):
    cfg = gpt_config(activation='relu2')
    mlp = MLP(cfg, normalized=False).double()
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    h = x @ mlp.c_fc.weight.T
    torch.testing.assert_close(mlp(x), (torch.where(h > 0, h, 0) ** 2) @ mlp.c_proj.weight.T, rtol=0, atol=1e-13)


def test_the_soft_cap_is_c_tanh_z_over_c_and_bounds_every_logit(gpt_config):
    model = GPT(gpt_config(logit_softcap=2.5, tie_weights=False)).double()
    with torch.no_grad():
        model.lm_head.weight.mul_(200)  # logits past the cap
    idx = torch.randint(11, (2, 16))
    raw = model.lm_head(model.trunk(model.wte(idx) + model.wpe(torch.arange(16))))
    logits, loss = model(idx, idx)
    torch.testing.assert_close(logits, 2.5 * torch.tanh(raw / 2.5), rtol=0, atol=1e-13)
    assert logits.abs().max() <= 2.5 and raw.abs().max() > 10
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), idx.flatten()))


def test_norms_without_gains_have_no_parameters_and_divide_by_the_rms(gpt_config):
    model = GPT(gpt_config(norm='rmsnorm', norm_gain=False))
    assert not [n for n, _ in model.named_parameters() if 'ln_' in n]
    x = torch.randn(4, 16, dtype=torch.float64)
    torch.testing.assert_close(model.blocks[0].ln_1.double()(x), x / x.square().mean(-1, keepdim=True).sqrt(),
                               rtol=1e-12, atol=0)
    assert not [n for n, _ in GPT(gpt_config(norm='layernorm', norm_gain=False)).named_parameters() if 'ln_' in n]


@pytest.mark.parametrize('n_layer,layers', [(1, ['0']), (3, ['0', '2']), (4, ['1', '3'])])
def test_value_embeddings_sit_on_every_other_layer_ending_at_the_last(n_layer, layers, gpt_config):
    """nanochat's layers; the embeddings are looked up (orthogpt.flops.lookups, as the positions are), outside the blocks, and a
    layer's attention has a gate exactly where it has embeddings, its weights drawn from [0, 0.02]."""
    model = GPT(gpt_config(value_embeds=True, n_layer=n_layer))
    assert list(model.value_embeds) == layers
    assert [str(i) for i, b in enumerate(model.blocks) if b.attn.ve_gate is not None] == layers
    assert lookups(model) == 16 * 16 + len(layers) * 11 * 16  # wpe, then vocab x n_embd per layer
    assert all(0 <= b.attn.ve_gate.weight.min() and b.attn.ve_gate.weight.max() <= 0.02
               for b in model.blocks if b.attn.ve_gate is not None)
    assert not any('value_embeds' in n for n, _ in model.blocks.named_parameters())


def test_value_embeddings_enter_a_layers_values_at_its_tokens(gpt_config):
    """A token's value embedding in a layer that has them moves the logits at that token and after it, never before
    it; a layer without them has none."""
    model = GPT(gpt_config(value_embeds=True, n_layer=2)).double()
    idx = torch.arange(16)[None] % 11
    before, _ = model(idx)
    with torch.no_grad():
        model.value_embeds['1'].weight[idx[0, 7]] += 1.0
    after, _ = model(idx)
    assert torch.equal(after[:, :7], before[:, :7]) and not torch.allclose(after[:, 7:], before[:, 7:])
    assert 'value_embeds.0.weight' not in dict(model.named_parameters())


@pytest.mark.parametrize('rule', list(RESIDUALS))
def test_decoding_under_the_preset_gives_the_full_forward_and_moves_its_window(rule, gpt_config, decodes_in_pieces):
    """RoPE at the positions the state holds: pieces through one DecodeState give the full forward in float64, and
    generation past block_size (the window moved on, read again from position 0) draws the uncached tokens."""
    model = GPT(gpt_config(residual=rule, n_layer=3, **MODERN)).double().eval()
    decodes_in_pieces(model, torch.randint(11, (3, 16)))
    prompt = torch.randint(11, (2, 4))
    runs = [decoding.generate(model, prompt, 24, top_k=8, shift=5, use_cache=c,
                              generator=torch.Generator().manual_seed(3)) for c in (True, False)]
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize('keys,message', [
    (dict(pos='rope', n_embd=12, n_head=4), "n_embd / n_head = 3 is odd"),
    (dict(rope_base=1.0), "rope_base=1.0 must exceed 1"),
    (dict(logit_softcap=-1.0), "logit_softcap=-1.0 must not be negative"),
    (dict(activation='swish'), "activation='swish' is not one of"),
])
def test_the_keys_refuse_what_they_cannot_compute(keys, message, gpt_config):
    with pytest.raises(ValueError, match=message):
        gpt_config(**keys)


@pytest.mark.parametrize('keys,message', [(dict(pos='rope'), "the ViT keeps its learned positions"),
                                          (dict(value_embeds=True), "a ViT's tokens are patches")])
def test_the_vit_refuses_rope_and_value_embeddings_with_the_reason(keys, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(n_layer=1, n_head=2, n_embd=16, image_size=8, **keys)


@pytest.mark.parametrize('rule', ['shakespeare_add', 'shakespeare_rot', 'shakespeare_ngpt', 'shakespeare_mhc',
                                  'shakespeare_attnres', 'shakespeare_denseformer', 'shakespeare_ddl'])
def test_the_preset_stacks_on_every_rule_config_and_keeps_the_rule(rule, root):
    cfg = configure.load([f'{root}/config/{rule}.py', f'{root}/config/modern.py', f'{root}/config/cpu.py'])
    plain = configure.load([f'{root}/config/{rule}.py', f'{root}/config/cpu.py'])
    assert cfg.residual == plain.residual and cfg.options == plain.options
    assert {k: getattr(cfg, k) for k in MODERN} == MODERN
    assert cfg.out_dir == plain.out_dir.replace('-cpu', '-modern-cpu')
    assert cfg.learning_rate == 1e-3  # rates tuned in GPT-2's block are not taken for this one


@pytest.mark.parametrize('tied', [True, False])
def test_an_untied_token_embedding_is_looked_up_and_a_tied_one_is_the_heads_matrix(tied, gpt_config):
    """What the MFU's 6N leaves out (tasks.flops_per_item): the tables read by index, not the head that multiplies."""
    model = GPT(gpt_config(tie_weights=tied, init='gpt2'))
    assert lookups(model) == 16 * 16 + (0 if tied else 11 * 16)  # wpe, and an untied wte (vocab x n_embd)


def test_value_embeddings_leave_v_in_autocasts_dtype(gpt_config, monkeypatch):
    """The table is float32; cast as nanochat casts it, attention's values (and a decode state's buffers) stay in
    the dtype autocast gives q and k, in the layers with embeddings as in those without."""
    model, seen, attend = GPT(gpt_config(value_embeds=True, n_layer=2)), [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, 'scaled_dot_product_attention', lambda q, k, v, **kw: seen.append(v.dtype) or attend(
        q, k, v, **kw))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        model(torch.randint(11, (2, 5)))
    assert seen == [torch.bfloat16] * 2


def test_the_preset_on_a_vit_config_says_why_not(root):
    with pytest.raises(UserError, match="pos='rope' numbers a sequence"):
        configure.load([f'{root}/config/vit_fashion_add.py', f'{root}/config/modern.py'])


def test_the_preset_sizes_with_depth_as_nanochat(root):
    """--depth after the preset: n_layer = n_head = depth, n_embd = 64 depth, and the value embeddings follow the
    layers; the blocks' parameters (what tokens_per_param counts) leave them out, as they leave the token embedding."""
    from configure.schema import block_parameters, build_model
    cfg = configure.load([f'{root}/config/shakespeare_add.py', f'{root}/config/modern.py', f'{root}/config/cpu.py',
                          '--depth=3'])
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd) == (3, 3, 192)
    with torch.device('meta'):
        model = build_model(cfg)
    assert list(model.value_embeds) == ['0', '2']
    assert block_parameters(cfg) == sum(p.numel() for p in model.parameters()) - lookups(model) - 192 * cfg.vocab_size
