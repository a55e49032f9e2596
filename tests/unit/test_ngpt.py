"""residual='ngpt', the normalized Transformer (Loshchilov et al., arXiv:2410.01131), and
optimizer='muon': unit norms where the paper puts them, the scaling vectors' restoration, and the
loop's DDP, gradient accumulation, scaler and exact resume with Muon's state."""

import math
from contextlib import nullcontext

import pytest
import torch

import configure
from model import GPT, GPTConfig
from orthogpt import optim


def tiny(**kw):
    return GPTConfig(**dict(dict(n_layer=3, n_head=2, n_embd=16, block_size=16, vocab_size=11, residual='ngpt', mlp='gated', mlp_ratio=4.0,
                                 tie_weights=False), **kw))


def stream_norms(model, idx):
    """||h|| of the embedding's output and of every block's input and output."""
    norms = []
    hooks = [model.ln_emb.register_forward_hook(lambda m, i, o: norms.append(o.norm(dim=-1)))]
    hooks += [b.register_forward_hook(lambda m, i, o: norms.append(o.norm(dim=-1))) for b in model.blocks]
    model(idx)
    for h in hooks:
        h.remove()
    return torch.stack(norms)


def normalised(model):
    """(name, the norms along the embedding dimension) of every matrix nGPT normalises."""
    yield from (('wte', model.wte.weight.norm(dim=1)), ('wpe', model.wpe.weight.norm(dim=1)),
                ('lm_head', model.lm_head.weight.norm(dim=1)))
    for i, b in enumerate(model.blocks):
        yield from ((f'{i}.c_attn', b.attn.c_attn.weight.norm(dim=1)), (f'{i}.attn.c_proj', b.attn.c_proj.weight.norm(dim=0)),
                    (f'{i}.c_fc', b.mlp.c_fc.weight.norm(dim=1)), (f'{i}.mlp.c_proj', b.mlp.c_proj.weight.norm(dim=0)))


def steps(model, cfg, n=10, micro_steps=1):
    opt = optim.make_optimizer(model, cfg, 'cpu')
    x = torch.randint(11, (n, 8, 16))
    for i in range(n):
        parts = iter(zip(x[i].chunk(micro_steps), torch.roll(x[i], -1, 1).chunk(micro_steps)))
        optim.train_step(model, opt, optim.StepScaler('cpu', 'float32'), lambda: next(parts), micro_steps, 1.0,
                            nullcontext())
    return opt


@pytest.mark.parametrize('qkv', ['dense', 'cayley'])
def test_the_stream_and_every_matrix_stay_on_the_unit_sphere(qkv):
    """At init and after steps; and it is the rule's after_step that keeps them there: one more
    optimizer step without it moves every other normalised matrix off the sphere."""
    cfg = configure.load(['--residual=ngpt', '--n_layer=3', '--n_head=2', '--n_embd=16', '--block_size=16',
                          '--vocab_size=11', '--tie_weights=False', '--weight_decay=0', '--learning_rate=3e-2', f'--qkv={qkv}'])
    model = GPT(configure.model_config(cfg))
    idx = torch.randint(11, (4, 16))
    for when in ('init', 'after steps'):
        assert (stream_norms(model, idx) - 1).abs().max() < 1e-5, when
        for name, norms in normalised(model):
            assert (norms - 1).abs().max() < 1e-5, (when, name)
        opt = steps(model, cfg)
    model.after_step = lambda: None  # the same step, without the rule's renormalisation
    x = torch.randint(11, (4, 16))
    optim.train_step(model, opt, optim.StepScaler('cpu', 'float32'), lambda: (x, x), 1, 1.0, nullcontext())
    off = [name for name, norms in normalised(model) if (norms - 1).abs().max() > 1e-4]
    orthogonal = [f'{i}.c_attn' for i in range(3)] if qkv != 'dense' else []  # an orthogonal map's rows are unit anyway
    assert sorted(off) == sorted(name for name, _ in normalised(model) if name not in orthogonal)


def test_the_scaling_vectors_start_at_the_papers_values_through_their_restoration():
    model = GPT(tiny())
    block = model.blocks[0]
    d = 16
    for vec, init, stored in ((block.update_attn.alpha, 0.05, 1 / math.sqrt(d)), (block.attn.s_qk, 1.0, 1 / math.sqrt(d)),
                              (block.mlp.s_uv, 1.0, 1.0), (model.s_z, 1.0, 1 / math.sqrt(d))):
        torch.testing.assert_close(vec.weight, torch.full_like(vec.weight, stored))  # what Adam steps
        torch.testing.assert_close(vec(), torch.full_like(vec.weight, init))  # what the model uses
    assert model.blocks[0].mlp.c_fc.out_features == 2 * 4 * d and isinstance(block.mlp.act, torch.nn.SiLU)
    assert all(isinstance(m, torch.nn.Identity) for b in model.blocks for m in (b.ln_1, b.ln_2)) and \
        isinstance(model.ln_f, torch.nn.Identity)


def test_attention_is_cosine_similarity_at_softmax_scale_sqrt_dk():
    """One head's attention weights against a float64 reference from the paper's Eq. 15-16."""
    model = GPT(tiny(n_layer=1)).double()
    attn, x = model.blocks[0].attn, torch.randn(1, 5, 16, dtype=torch.float64)
    got = []
    handle = attn.c_proj.register_forward_pre_hook(lambda m, args: got.append(args[0]))
    with torch.no_grad():
        attn.s_qk.weight.uniform_(0.1, 0.5)
        attn(x)
    handle.remove()
    q, k, v = attn.c_attn(x).view(5, 3, 2, 8).unbind(1)  # (T, heads, 8)
    s = attn.s_qk().view(2, 8)
    q, k = q / q.norm(dim=-1, keepdim=True) * s, k / k.norm(dim=-1, keepdim=True) * s
    scores = torch.einsum('thd,shd->hts', q, k) * math.sqrt(8) + torch.full((5, 5), -math.inf).triu(1)
    expected = torch.einsum('hts,shd->thd', scores.softmax(-1), v).reshape(1, 5, 16)
    torch.testing.assert_close(got[0], expected, rtol=1e-10, atol=1e-10)


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    cfg = configure.load(['--residual=ngpt', '--n_layer=2', '--n_head=2', '--n_embd=16', '--vocab_size=11',
                          '--tie_weights=False', '--qkv=cayley', '--optimizer=muon', '--muon_lr=0.05'])
    model = GPT(configure.model_config(cfg))
    opt = optim.make_optimizer(model, cfg, 'cpu')
    names = {p: n for n, p in model.named_parameters()}
    muon = sorted(names[p] for g in opt.named['muon'].param_groups for p in g['params'])
    assert muon == sorted(f'blocks.{i}.{k}' for i in range(2) for k in (
        'attn.c_attn.parametrizations.weight.original', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight'))
    adamw = {names[p] for g in opt.named['adamw'].param_groups for p in g['params']}
    assert {'wte.weight', 'wpe.weight', 'lm_head.weight', 's_z.weight', 'blocks.0.attn.s_qk.weight',
            'blocks.0.update_mlp.alpha.weight'} <= adamw and not adamw & set(muon)
    opt.set_lr(0.5)
    assert {g['lr'] for g in opt.named['muon'].param_groups} == {0.025}
    assert {g['lr'] for g in opt.named['adamw'].param_groups} == {cfg.learning_rate / 2}


def test_muon_accumulates_gradients_as_one_big_batch():
    cfg = configure.load(['--n_layer=2', '--n_head=2', '--n_embd=16', '--block_size=16', '--vocab_size=11',
                          '--optimizer=muon', '--qkv=exp'])
    results = []
    for micro_steps in (1, 2):
        torch.manual_seed(0)
        model = GPT(configure.model_config(cfg)).double()
        torch.manual_seed(1)
        steps(model, cfg, n=2, micro_steps=micro_steps)
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=1e-10)


def test_one_non_finite_gradient_skips_every_optimizer():
    """Muon and AdamW decide their skips apart; a NaN in one AdamW parameter's gradient must stop
    Muon's step as well, and the step after it goes on as usual."""
    cfg = configure.load(['--n_layer=2', '--n_head=2', '--n_embd=16', '--block_size=16', '--vocab_size=11',
                          '--optimizer=muon'])
    model = GPT(configure.model_config(cfg))
    poisoned = [True]
    model.wpe.weight.register_hook(lambda g: g * float('nan') if poisoned[0] else g)
    before = [p.detach().clone() for p in model.parameters()]
    opt = steps(model, cfg, n=1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    poisoned[0] = False
    x = torch.randint(11, (4, 16))
    optim.train_step(model, opt, optim.StepScaler('cpu', 'float32'), lambda: (x, x), 1, 1.0, nullcontext())
    assert not torch.equal(before[0], model.wte.weight) and not torch.equal(before[2], model.blocks[0].attn.c_attn.weight)


def test_a_normalized_vit_scales_its_logits():
    from model import ViT, ViTConfig
    model = ViT(ViTConfig(image_size=8, patch_size=4, channels=1, n_classes=3, n_layer=1, n_head=2, n_embd=16,
                          residual='ngpt'))
    torch.testing.assert_close(model.s_z(), torch.ones(3))
    with torch.no_grad():
        model.s_z.weight.mul_(10)
    x = torch.randn(2, 1, 8, 8)
    assert model(x)[0].abs().max() > 2  # cosines times 10: beyond the [-1, 1] of unscaled ones
