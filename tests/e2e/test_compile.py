"""torch.compile on every variant: training's forward and backward in one graph, decoding's step
through the fixed-shape state in one graph compiled once, generation with the default compiler, and
train.py's compiled loop traced once for training and once for evaluation."""

import pytest
import torch
from torch._dynamo.utils import counters

import train
from model import GPT, DecodeState
from orthogpt import decoding
from orthogpt.maps import maps_held

VARIANTS = [dict(residual='additive'), dict(residual='rotation'), dict(residual='ngpt'),
            dict(residual='orthogonal', ortho_mode='feature'),
            dict(residual='orthogonal', ortho_mode='global'),
            dict(residual='orthogonal', ortho_mode='global', ortho_prob=0.5),
            dict(residual='hc'), dict(residual='hc', hc_recompute=True), dict(residual='mhc'),
            dict(residual='mhc', hc_dynamic=False), dict(residual='mhc', mhc_res='identity', hc_recompute=True),
            dict(residual='mhc', mhc_res='permutation'), dict(residual='mhc', mhc_res='cayley', hc_recompute=True),
            dict(residual='hc', hc_kernels='triton'), dict(residual='mhc', hc_kernels='triton'),  # interpreted on a CPU
            dict(residual='mhc', mhc_res='cayley', hc_kernels='triton'),
            dict(residual='ddl', x0_mix='nanochat'), dict(residual='attnres'), dict(residual='attnres', attnres_block=2),
            dict(residual='denseformer'), dict(residual='additive', x0_mix='identity')]
MODERN = dict(pos='rope', qk_norm=True, activation='relu2', norm='rmsnorm', norm_gain=False, logit_softcap=15.0,
              value_embeds=True, tie_weights=False)  # config/modern.py's block
VARIANTS += [dict(residual=rule, **MODERN) for rule in  # every rule of model.py
             ('additive', 'orthogonal', 'rotation', 'ngpt', 'hc', 'mhc', 'ddl', 'attnres', 'denseformer')]


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


DECODERS = [dict(residual='additive', qkv='cayley'), dict(residual='rotation'), dict(residual='ngpt', qkv='exp'),
            dict(residual='orthogonal', ortho_mode='feature'), dict(residual='orthogonal', ortho_mode='global'),
            dict(residual='hc'), dict(residual='mhc'), dict(residual='mhc', mhc_res='identity'),
            dict(residual='mhc', mhc_res='permutation'), dict(residual='mhc', mhc_res='cayley'),
            dict(residual='ddl', x0_mix='nanochat'), dict(residual='attnres', attnres_block=2), dict(residual='denseformer'),
            dict(residual='additive', **MODERN), dict(residual='orthogonal', ortho_mode='global', **MODERN),
            dict(residual='hc', **MODERN), dict(residual='denseformer', **MODERN)]


@pytest.fixture
def no_recompiles():
    """A recompile raises: every call after the first must reuse the one compiled graph."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield


@pytest.mark.parametrize('variant', DECODERS, ids=lambda v: '-'.join(map(str, v.values())))
def test_decoding_through_the_state_compiles_once_in_one_graph(variant, gpt_config, no_recompiles):
    """The one-token forward through a DecodeState traces without a graph break, has the same shapes at every
    position and after the window is read again from position 0 (so it compiles once), and gives eager mode's
    logits."""
    torch.manual_seed(0)
    model = GPT(gpt_config(**variant)).eval()
    compiled = torch.compile(model, backend='aot_eager', fullgraph=True, dynamic=False)
    idx = torch.randint(11, (2, 16))
    state = DecodeState(model.config.block_size)
    with torch.inference_mode(), maps_held(model):
        for window in (idx, idx[:, 7:]):  # the second: the window moved on, into the same buffers
            full, _ = model(window)
            state.pos.zero_()
            pieces = [model(window[:, :5], cache=state)[0]]  # the buffers' first forward, eager
            pieces += [compiled(window[:, t:t + 1], cache=state)[0] for t in range(5, window.shape[1])]
            torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-5, atol=1e-5)


def test_compiled_generation_draws_the_same_tokens(gpt_config, no_recompiles):
    """Generation with the step compiled (decoding.compiled: the default compiler, fullgraph=True), 300 tokens
    past many moves of the window with no recompile, draws the tokens that the eager step and the uncached
    forward draw from the same seed; a second generation, of another prompt and length, reuses the compiled step."""
    torch.manual_seed(0)
    model = GPT(gpt_config(residual='orthogonal', ortho_mode='global', qkv='cayley')).eval()
    prompt = torch.randint(11, (1, 3))

    def run(prompt=prompt, n=300, **how):
        return decoding.generate(model, prompt, n, top_k=8, generator=torch.Generator().manual_seed(3), **how)
    compiled = run(compile=True)
    assert compiled.shape == (1, 303)
    assert torch.equal(compiled, run()) and torch.equal(compiled, run(use_cache=False))
    assert torch.equal(run(compile=True), compiled)
    assert torch.equal(run(prompt[:, :2], 40, compile=True), run(prompt[:, :2], 40))


def test_several_models_decoded_in_turn_through_the_compiled_step_each_draw_their_own_tokens(gpt_config):
    """Three models through the one compiled step in turn, twice: two of the additive rule (other weights, one graph)
    and one of the rotation rule (a graph of its own). Each generation's first compiled step runs every guard, the
    steps after it only those that tell the graphs apart (decoding.generate): each model still draws the tokens that
    its eager step draws."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    models = [GPT(gpt_config(**keys)).eval() for keys in (dict(), dict(residual='rotation'), dict())]
    prompt = torch.randint(11, (1, 3))

    def run(model, **how):
        return decoding.generate(model, prompt, 24, top_k=8, generator=torch.Generator().manual_seed(3), **how)
    eager = [run(m) for m in models]
    assert not torch.equal(eager[0], eager[2])  # the two additive models differ
    for _ in range(2):
        for model, tokens in zip(models, eager):
            assert torch.equal(run(model, compile=True), tokens)


@pytest.mark.parametrize('variant', [
    ['--residual=orthogonal', '--ortho_prob=0.5', '--dropout=0.1'], ['--residual=mhc', '--qkv=exp'],
    ['--residual=ngpt'], ['--residual=rotation', '--optimizer=muon', '--qkv=cayley'], ['config/modern.py']],
    ids=['orthogonal-dropout', 'mhc-exp', 'ngpt', 'rotation-muon-cayley', 'modern'])
def test_compiled_training_traces_once_for_training_and_once_for_evaluation(variant, tiny, char_data, tmp_path, logs,
                                                                              monkeypatch):
    """train.py's compiled model (the default on CUDA) over 8 iterations of 2 micro-steps and 5 evaluations: dynamo
    traces two graphs, training's and evaluation's (grad mode off), and never again, as a step that recompiled would
    run slower or, past dynamo's cache limit, eagerly; the losses are the uncompiled loop's. Dynamo's eager backend
    stands for inductor, whose compile takes minutes on a CPU: recompiles are dynamo's, whatever the backend."""
    compile_ = torch.compile
    monkeypatch.setattr(torch, 'compile', lambda model, **kw: compile_(model, backend='eager', **kw))
    args = ['config/shakespeare_add.py', *tiny, f'--data_dir={char_data}', '--max_iters=8', '--eval_interval=2',
            '--gradient_accumulation_steps=2', *variant]
    torch._dynamo.reset()
    counters.clear()
    train.main([*args, '--compile=True', f'--out_dir={tmp_path / "compiled"}'])
    assert counters['stats']['unique_graphs'] == 2
    train.main([*args, f'--out_dir={tmp_path / "eager"}'])
    assert logs.losses(tmp_path / 'compiled') == logs.losses(tmp_path / 'eager')
