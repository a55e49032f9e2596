"""torch.compile on every variant: training's forward and backward in one graph, decoding's step
through the fixed-shape state in one graph compiled once (whole, or one that every block reuses), generation with the
default compiler, and train.py's compiled loop traced once for training and once for evaluation."""

import pytest
import torch
from torch._dynamo.utils import counters

import train
from model import GPT, RESIDUALS, DecodeState
from orthogpt import decoding, regional
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
VARIANTS += [dict(residual=rule, **MODERN) for rule in  # each rule in its blocks: the tests of compiled_blocks below;
             ('additive', 'rotation', 'ngpt', 'mhc', 'attnres')]  # here each path of the trunk outside the blocks


@pytest.mark.parametrize('variant,qkv', [(v, 'dense') for v in VARIANTS] + [
    (dict(residual='orthogonal', ortho_mode='feature', ortho_prob=0.5), 'dense'), (dict(residual='additive', norm='rmsnorm'), 'cayley'),
    (VARIANTS[1], 'exp')], ids=lambda v: '-'.join(map(str, v.values())) if isinstance(v, dict) else v)
def test_compiles_in_one_graph(variant, qkv, gpt_config):
    """torch.compile of the whole model traces the forward and the backward (the update rules, the Q/K/V maps)
    without a graph break, and computes what eager mode does. In the modern block, each kind of trunk (the stream's
    first and last norms, n copies, a read-out across depth, nGPT's logit scale under the soft-cap); every rule in
    its blocks: a block at a time, below."""
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


RULES = [dict(residual=rule) for rule in RESIDUALS] + [dict(residual=rule, **MODERN) for rule in RESIDUALS] + [
    dict(residual='attnres', attnres_block=3), dict(residual='additive', x0_mix='nanochat')]


def compiled_step(model, backend, idx):
    """(losses, gradients) of one forward and backward of eager mode's and of regional.compiled_blocks(model,
    backend=backend, fullgraph=True)'s: no graph break in a block."""
    losses, grads = [], []
    for m in (model, regional.compiled_blocks(model, backend=backend, fullgraph=True)):
        torch.manual_seed(1)
        _, loss = m(idx, torch.roll(idx, -1, 1))
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
        model.zero_grad()
    return losses, grads


@pytest.mark.parametrize('variant', RULES + [dict(residual='rotation', qkv='cayley')],
                         ids=lambda v: '-'.join(map(str, v.values())))
def test_a_block_at_a_time_computes_eager_modes_loss_and_gradients(variant, gpt_config):
    """Per-block compile (regional.compiled_blocks, train.py's default), through AOTAutograd's backward (aot_eager:
    inductor's input, without its minutes of compiling on a CPU), gives eager mode's loss and gradients; with an
    orthogonal Q/K/V map too, whose parametrized Linear is a class of its own in each block (a graph a block)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    losses, grads = compiled_step(GPT(gpt_config(**variant)).train(), 'aot_eager', torch.randint(11, (2, 16)))
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('variant', RULES, ids=lambda v: '-'.join(map(str, v.values())))
def test_a_block_at_a_time_traces_as_many_graphs_at_any_depth(variant, gpt_config):
    """A forward and backward of 8 layers traces as many graphs as one of 4 (the depth rules through Depth's lists of
    one length; blocks of 3 sublayers fall in 3 patterns): compile time that does not grow with depth. Dynamo's
    graphs, counted on its eager backend."""
    counts = []
    for n_layer in (4, 8):
        torch._dynamo.reset()
        traced = []
        model = GPT(gpt_config(n_layer=n_layer, **variant)).train()
        compiled_step(model, lambda gm, inputs: traced.append(gm) or gm.forward, torch.randint(11, (2, 16)))
        counts.append(len(traced))
    assert counts[0] == counts[1], counts


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


@pytest.mark.parametrize('scope,qkv', [('blocks', 'dense'), ('model', 'cayley')])
def test_compiled_generation_draws_the_same_tokens(scope, qkv, gpt_config, no_recompiles):
    """Generation with the step compiled (decoding.compiled: the default compiler, fullgraph=True), a block at a time
    (one graph for both blocks) or whole, 300 tokens past many moves of the window with no recompile, draws the
    tokens that the eager step and the uncached forward draw from the same seed; a second generation, of another
    prompt and length, reuses the compiled step."""
    torch.manual_seed(0)
    model = GPT(gpt_config(residual='orthogonal', ortho_mode='global', qkv=qkv)).eval()
    prompt = torch.randint(11, (1, 3))

    def run(prompt=prompt, n=300, **how):
        return decoding.generate(model, prompt, n, top_k=8, generator=torch.Generator().manual_seed(3), **how)
    compiled = run(compile=True, compile_scope=scope)
    assert compiled.shape == (1, 303)
    assert torch.equal(compiled, run()) and torch.equal(compiled, run(use_cache=False))
    assert torch.equal(run(compile=True, compile_scope=scope), compiled)
    assert torch.equal(run(prompt[:, :2], 40, compile=True, compile_scope=scope), run(prompt[:, :2], 40))


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


TRAINED = {'orthogonal-dropout': ['--residual=orthogonal', '--ortho_prob=0.5', '--dropout=0.1'],
           'mhc-exp': ['--residual=mhc', '--qkv=exp'], 'ngpt': ['--residual=ngpt'],
           'rotation-muon-cayley': ['--residual=rotation', '--optimizer=muon', '--qkv=cayley'],
           'modern': ['config/modern.py'], 'attnres': ['--residual=attnres'], 'denseformer': ['--residual=denseformer']}


@pytest.mark.parametrize('variant,scope', [(v, 'blocks') for v in TRAINED.values()] + [
    (TRAINED['orthogonal-dropout'], 'model'), (TRAINED['modern'], 'model')],
    ids=[*TRAINED, 'orthogonal-dropout-whole', 'modern-whole'])
def test_compiled_training_traces_once_for_training_and_once_for_evaluation(variant, scope, tiny, char_data, tmp_path,
                                                                              logs, monkeypatch):
    """train.py's compiled model (the default on CUDA) over 8 iterations of 2 micro-steps and 5 evaluations: dynamo
    traces training's graphs and evaluation's (grad mode off) in the first of each and never again, as a step that
    recompiled would run slower or, past dynamo's cache limit, eagerly; the losses are the uncompiled loop's. Whole
    (compile_scope=model), that is two graphs; a block at a time, as many as one iteration and one evaluation trace
    (a block of its own: the first, where it reads the embeddings, or one with value embeddings). Dynamo's eager
    backend stands for inductor, whose compile takes minutes on a CPU: recompiles are dynamo's, whatever the backend."""
    compile_ = torch.compile
    monkeypatch.setattr(torch, 'compile', lambda model, **kw: compile_(model, backend='eager', **kw))
    args = ['config/shakespeare_add.py', *tiny, f'--data_dir={char_data}', '--eval_interval=2',
            '--gradient_accumulation_steps=2', *variant, f'--compile_scope={scope}']

    def graphs(out, *more):
        torch._dynamo.reset()
        counters.clear()
        train.main([*args, *more, '--compile=True', f'--out_dir={tmp_path / out}'])
        return counters['stats']['unique_graphs']
    traced = graphs('compiled', '--max_iters=8')
    assert traced == (2 if scope == 'model' else graphs('first', '--max_iters=1', '--eval_interval=1'))
    train.main([*args, '--max_iters=8', f'--out_dir={tmp_path / "eager"}'])
    assert logs.losses(tmp_path / 'compiled') == logs.losses(tmp_path / 'eager')


@pytest.mark.parametrize('variant', [dict(residual='attnres', attnres_block=2), dict(residual='denseformer'),
                                     dict(residual='orthogonal', ortho_mode='global', **MODERN), dict(residual='hc')],
                         ids=lambda v: '-'.join(map(str, v.values())))
def test_a_block_at_a_time_decodes_eager_modes_greedy_tokens_in_as_many_graphs_at_any_depth(variant, gpt_config):
    """Generation through the per-block compiled model, its blocks reading and writing their layer's buffers of the
    DecodeState, past moves of the window: the greedy tokens of the eager model, in as many graphs at 5 layers as at
    2 (the prompt's and the moved window's reads, the one-token step; the first block's, where its input or its
    parameters differ), not a graph a block."""
    graphs = []
    for n_layer, backend in ((2, 'aot_eager'), (5, 'eager')):  # dynamo's graphs are the same on either backend
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = GPT(gpt_config(n_layer=n_layer, **variant)).eval()
        prompt = torch.randint(11, (2, 3))
        eager = decoding.generate(model, prompt, 24, top_k=1)
        compiled = regional.compiled_blocks(model, backend=backend, fullgraph=True)
        assert torch.equal(decoding.generate(compiled, prompt, 24, top_k=1), eager)
        graphs.append(counters['stats']['unique_graphs'])
    assert graphs[0] == graphs[1] > 0