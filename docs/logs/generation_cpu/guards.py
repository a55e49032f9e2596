"""A/B on this CPU, in one process, interleaved: decoding.generate(compile=True) as committed at 4dea0ab ('stance':
each generation's steps after its first run only the differentiating guards) against the same with
torch.compiler.set_stance replaced by a no-op ('guards': every guard at every step). 500 tokens after a 1-token prompt,
top_k 200, the 16 x 256 model of config/shakespeare_add.py at random weights, float32; 1 warm round, then 4 timed.

    python docs/logs/generation_cpu/guards.py additive|mhc
"""
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
import torch  # noqa: E402

from model import GPT, GPTConfig  # noqa: E402
from orthogpt import decoding  # noqa: E402

rule = sys.argv[1]
cfg = GPTConfig(n_layer=16, n_head=4, n_embd=256, block_size=256, vocab_size=65, norm='rmsnorm', activation='relu',
                init='sigma', tie_weights=False, residual=rule)
torch.manual_seed(0)
model = GPT(cfg).eval()
prompt = torch.zeros(1, 1, dtype=torch.long)
real = torch.compiler.set_stance
times, outs = {'guards': [], 'stance': []}, {}
for r in range(5):
    for mode in times:
        torch.compiler.set_stance = real if mode == 'stance' else (lambda *a, **k: contextlib.nullcontext())
        t = time.perf_counter()
        out = decoding.generate(model, prompt, 500, top_k=200, generator=torch.Generator().manual_seed(0),
                                compile=True)
        s = time.perf_counter() - t
        outs.setdefault(mode, out)
        if r:
            times[mode].append(s)
torch.compiler.set_stance = real
for mode, ts in times.items():
    print(rule, mode, 'tokens/s by round', [round(500 / s) for s in ts], f'median {500 / statistics.median(ts):.0f}')
print(rule, 'same tokens:', torch.equal(outs['guards'], outs['stance']))
