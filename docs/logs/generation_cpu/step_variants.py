"""The compiled decoding step, three ways, in interleaved rounds on the 16 x 256 model of config/shakespeare_add.py
(random weights), 300 tokens after a one-token prompt, batch 1, top_k 200 (docs/performance.md):
  step    decoding.compiled as it is (SDPA's own CPU kernel for attention);
  math    SDPA's math backend inside the compiled step, so that inductor compiles attention (its batched products
          turned into reductions, as decompose_mm_pass does for the linears);
  bf16    the model's weights in bfloat16 (model.to(torch.bfloat16)), decoding.compiled as it is;
  bf16_math  both;
  cpp_wrapper  decoding.compiled's options with inductor's C++ wrapper (cpp_wrapper), which calls the kernels from
          C++ rather than from a Python function;
  freezing  decoding.compiled's options with inductor's freezing (the weights folded into the graph as constants,
          the linears' weights prepacked for oneDNN).
The third argument, if given, names the ways to run besides step (comma-separated).

    python docs/logs/generation_cpu/step_variants.py additive 9
    python docs/logs/generation_cpu/step_variants.py additive 5 cpp_wrapper,freezing
"""
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, '.')
from model import GPT, GPTConfig  # noqa: E402
from orthogpt import decoding  # noqa: E402


def math(*args, **kwargs):
    with sdpa_kernel(SDPBackend.MATH):
        return decoding.step(*args, **kwargs)


rule, rounds, N = sys.argv[1], int(sys.argv[2]), 300
chosen = ['step', *(sys.argv[3].split(',') if len(sys.argv) > 3 else ['math', 'bf16', 'bf16_math'])]
torch.manual_seed(0)
cfg = GPTConfig(n_layer=16, n_head=4, n_embd=256, block_size=256, vocab_size=65, residual=rule, norm='rmsnorm',
                activation='relu', init='sigma', tie_weights=False)
model = GPT(cfg).eval()
half = GPT(cfg).eval()
half.load_state_dict(model.state_dict())
half.to(torch.bfloat16)
idx = torch.zeros(1, 1, dtype=torch.long)
mm = {'post_grad_fusion_options': {'decompose_mm_pass': {'cpu_max_first_dimension_decomposition': 64}}}
ways = {'step': (model, decoding.compiled(idx.device)),
        'math': (model, torch.compile(math, fullgraph=True, dynamic=False, options=mm)),
        'bf16': (half, decoding.compiled(idx.device)),
        'bf16_math': (half, torch.compile(lambda *a, **k: math(*a, **k), fullgraph=True, dynamic=False, options=mm))}
for option in ('cpp_wrapper', 'freezing'):  # a function of its own each: torch.compile's cache is per function
    ways[option] = (model, torch.compile(lambda *a, **k: decoding.step(*a, **k), fullgraph=True, dynamic=False,
                                         options={'post_grad_fusion_options': {'decompose_mm_pass': {}}, option: True}))
ways = {way: ways[way] for way in chosen}


def generate(way):
    net, one = ways[way]
    decoding.compiled = lambda device: one
    t0 = time.perf_counter()
    out = decoding.generate(net, idx, N, 0.8, 200, generator=torch.Generator().manual_seed(1), compile=True)
    return N / (time.perf_counter() - t0), out


eager = decoding.generate(model, idx, N, 0.8, 200, generator=torch.Generator().manual_seed(1))
for way in ways:
    rate, out = generate(way)
    print(f"{way}: first generation at {rate:.0f} tokens/s (compiles), its tokens those of the eager float32 step: "
          f"{bool((out == eager).all())}", flush=True)
rates = {way: [] for way in ways}
for _ in range(rounds):
    for way in ways:
        rates[way].append(generate(way)[0])
for way, r in rates.items():
    paired = sorted(a / b for a, b in zip(r, rates['step']))
    print(f"{way}: median {sorted(r)[len(r) // 2]:.0f} tokens/s, rounds {[round(x) for x in r]}; over step: median "
          f"{paired[len(r) // 2]:.2f}x, min {paired[0]:.2f}x, max {paired[-1]:.2f}x")
