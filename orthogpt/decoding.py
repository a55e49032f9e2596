"""Text generation: tokens sampled one at a time after a prompt, each read against the model's DecodeState
(model.py), the context window moved on past block_size, and the one-token step compiled once, a block at a time.

    out = decoding.generate(model, idx, 500, temperature=0.8, top_k=200, compile=True)

As in gpt-fast (pytorch-labs/gpt-fast): buffers of fixed shape written at a position tensor, a sampler with no host
sync, and a compiled step: one graph that every block reuses, or the whole step's, which a CUDA graph replays on a GPU
(torch.compile's 'reduce-overhead').
"""

from contextlib import nullcontext
from functools import partial

import torch
from torch.nn.utils import parametrize

from model import DecodeState
from orthogpt.regional import compiled_blocks


def sample(logits, noise, temperature=1.0, top_k=None):
    """Tokens (B,) drawn from softmax(logits / temperature) over the top_k largest logits (B, vocab), with no host sync:
    the Gumbel-max trick, the argmax of logits / temperature - log(noise) for Exp(1) noise (B, vocab). The noise is kept
    off 0, where a hidden logit's -inf would meet +inf."""
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]  # (B, 1)
        logits = torch.where(logits < kth, -float('inf'), logits)
    return (logits - noise.clamp_min(torch.finfo(noise.dtype).tiny).log()).argmax(-1)


def step(model, idx, noise, state, temperature=1.0, top_k=None):
    """The token (B,) after idx (B, T), drawn with noise; with a DecodeState, idx continues its sequence and it takes
    idx in. The one function that decodes, eager or compiled."""
    return sample(model(idx, cache=state, last=True)[0][:, -1], noise, temperature, top_k)


def static(state):
    """Mark every tensor of a DecodeState as lying where it is, for torch.compile: a CUDA graph then reads and writes
    it in place (a tensor it writes must be static, or the step is not captured at all)."""
    for t in (state.pos, *state.tensors()):
        torch._dynamo.mark_static_address(t)


def compiled(model, device, scope='blocks'):
    """The one-token step (model, as step's first argument, bound) compiled. scope 'blocks': each block compiled, one
    graph that every block reuses (compiled_blocks: compile time about one block's whatever the depth; with orthogonal
    Q/K/V maps, a graph a block), the rest eager; 'model': the whole step in one graph, replayed as a CUDA graph on a
    GPU (torch.compile's 'reduce-overhead'; a block's graph, reused at every block's buffers, is not). At batch 1 each
    linear is a product of one row, which BLAS runs as a gemv on one thread at a fraction of a CPU's bandwidth;
    inductor's decompose_mm_pass makes it a reduction of its own, spread over the threads (the compiled step 1.9x
    faster on the 2-core CPU of docs/performance.md; on a GPU the pass leaves such small products alone)."""
    if scope not in ('blocks', 'model'):
        raise ValueError(f"compile_scope={scope!r} is not one of 'blocks' | 'model'")
    options = {'post_grad_fusion_options': {'decompose_mm_pass': {}}}
    if scope == 'blocks':
        return partial(step, compiled_blocks(model, fullgraph=True, options=options))
    return partial(torch.compile(step, fullgraph=True, dynamic=False,
                                 options={**options, 'triton.cudagraphs': device.type == 'cuda'}), model)


def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None, use_cache=True, shift=None,
             compile=False, compile_scope='blocks'):
    """idx (B, T) with max_new_tokens sampled tokens appended. Past block_size the window drops its oldest tokens
    `shift` at a time (1: nanoGPT's sliding window; default block_size // 4). use_cache: one DecodeState for the whole
    generation, into which each window is read once, then each new token alone; use_cache=False reads the whole
    window for every token (the same tokens, up to rounding). compile: that one-token step compiled (`compiled`, a
    block at a time or, compile_scope='model', whole); its first call compiles it, and later generations with the
    model reuse it. Each generation's first compiled step runs all of dynamo's guards (a model or state it has not met
    compiles anew there); the steps after it, whose inputs differ from it only in their values, run only the guards
    that tell the graphs compiled so far apart
    (torch.compiler.set_stance's skip_guard_eval_unsafe: about a thousand checks of the model's modules, 4-26% of a
    token's time on the 2-core CPU of docs/performance.md)."""
    (B, T), block = idx.shape, model.config.block_size
    shift = max(1, block // 4) if shift is None else shift
    if not 1 <= shift <= block:
        raise ValueError(f"shift={shift} must lie in [1, block_size={block}]")
    one = compiled(model, idx.device, compile_scope) if compile else partial(step, model)
    with torch.inference_mode(), parametrize.cached():  # Q/K/V maps computed once, not once per token
        out = torch.cat([idx, idx.new_empty(B, max_new_tokens)], 1)  # every token, read back once at the end
        last = idx.new_empty(B, 1)  # the step's input, of one stride whatever out's length (no recompile)
        state, start, fresh = DecodeState(block, idx.device) if use_cache else None, 0, True
        checked = False  # whether this generation's first compiled step ran, with all the guards
        for t in range(T, T + max_new_tokens):
            noise = torch.empty(B, model.config.vocab_size, device=idx.device).exponential_(generator=generator)
            if t - start > block:  # the window moves on
                start, fresh = t - (block - shift + 1), True
            if fresh or state is None:  # the whole window, eager (the state's buffers are allocated at its first)
                if state is not None:
                    state.pos.zero_()
                out[:, t], fresh = step(model, out[:, start:t], noise, state, temperature, top_k), False
                if compile and compile_scope == 'model' and state is not None:
                    static(state)
            else:  # the last token alone, at the state's position
                with torch.compiler.set_stance(skip_guard_eval_unsafe=True) if checked else nullcontext():
                    out[:, t] = one(last.copy_(out[:, t - 1:t]), noise, state, temperature, top_k)
                checked = compile
    return out.clone()  # outside inference mode: usable in autograd
