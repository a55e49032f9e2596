"""torch.compile on every variant: training's forward and backward in one graph, decoding's cached
steps and windows under dynamic shapes, and generate(compile=True) with the default compiler."""

import pytest
import torch

from model import GPT, DecodeCache
from orthogpt.maps import maps_held

VARIANTS = [dict(residual='additive'), dict(residual='rotation'), dict(residual='ngpt'),
            dict(residual='orthogonal', ortho_mode='feature'),
            dict(residual='orthogonal', ortho_mode='global'),
            dict(residual='orthogonal', ortho_mode='global', ortho_prob=0.5),
            dict(residual='hc'), dict(residual='hc', hc_recompute=True), dict(residual='mhc'),
            dict(residual='mhc', hc_dynamic=False), dict(residual='mhc', mhc_res='identity', hc_recompute=True),
            dict(residual='mhc', mhc_res='permutation'), dict(residual='mhc', mhc_res='cayley', hc_recompute=True)]


@pytest.mark.parametrize('variant,qkv', [(v, 'dense') for v in VARIANTS] + [
    (dict(residual='orthogonal', ortho_mode='feature', ortho_prob=0.5), 'dense'), (dict(residual='additive', norm='rmsnorm'), 'cayley'),
    (VARIANTS[1], 'exp')], ids=lambda v: '-'.join(map(str, v.values())) if isinstance(v, dict) else v)
def test_compiles_in_one_graph(variant, qkv, gpt_config):
    """torch.compile traces the forward and the backward (the update rules, the Q/K/V maps)
    without a graph break, and computes what eager mode does."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(gpt_config(qkv=qkv, **variant)).train()
    compiled = torch.compile(model, backend='aot_eager', fullgraph=True)
    idx = torch.randint(11, (2, 16))
    losses, grads = [], []
    for m in (model, compiled):
        torch.manual_seed(1)  # the same draws of ortho_prob's connections
        _, loss = m(idx, torch.roll(idx, -1, 1))
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
        model.zero_grad()
    assert torch.allclose(losses[0], losses[1], rtol=1e-5)
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


DECODERS = [dict(residual='additive', qkv='cayley'), dict(residual='rotation'),
            dict(residual='orthogonal', ortho_mode='feature'), dict(residual='orthogonal', ortho_mode='global'),
            dict(residual='hc'), dict(residual='mhc')]


@pytest.mark.parametrize('variant', DECODERS, ids=lambda v: '-'.join(map(str, v.values())))
def test_decoding_compiles_in_one_graph(variant, gpt_config):
    """What generate(compile=True) compiles, a cached step at any position and an uncached window
    of any length, traces without a graph break under dynamic shapes and gives eager mode's logits."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(gpt_config(**variant)).eval()
    compiled = torch.compile(model, backend='aot_eager', dynamic=True, fullgraph=True)
    idx = torch.randint(11, (2, 12))
    with torch.inference_mode(), maps_held(model):
        full, _ = model(idx)
        cache = DecodeCache(model.config.block_size)
        pieces = [model(idx[:, :5], cache=cache)[0]] + [compiled(idx[:, t:t + 1], cache=cache)[0] for t in range(5, 12)]
        windows = [compiled(idx[:, :t])[0] for t in (7, 12)]
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(windows[0], full[:, :7], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(windows[1], full, rtol=1e-5, atol=1e-5)


def test_compiled_generation_draws_the_same_tokens(gpt_config):
    """generate(compile=True), with the default compiler, past two moves of the window; a second
    call reuses the compiled code (the Cayley maps it holds are new tensors each call)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(gpt_config(residual='orthogonal', qkv='cayley')).eval()
    prompt = torch.randint(11, (1, 3))

    def run(use_cache, compile):
        return model.generate(prompt, 24, top_k=8, use_cache=use_cache, compile=compile,
                              generator=torch.Generator().manual_seed(3))
    runs = [run(True, True), run(False, True), run(False, False)]
    assert torch.equal(runs[0], runs[2]) and torch.equal(runs[1], runs[2])
    with torch.compiler.set_stance('fail_on_recompile'):
        assert torch.equal(run(True, True), runs[2])
