"""Decoding as issue 44 first measured it: GPT.generate of the code before the decode state (commit 454b3bf), 400
tokens after a one-token prompt, batch 1, top_k 200, cached, uncached and compiled (torch.compile(model,
dynamic=True)), the 16 x 256 model of config/shakespeare_add.py with random weights; 3 rounds after a warm one.

    git worktree add /tmp/old454 454b3bf && python docs/logs/generation_cpu/issue_method.py /tmp/old454
"""
import sys
import time

import torch

sys.path.insert(0, sys.argv[1])
from model import GPT, GPTConfig  # noqa: E402

torch.manual_seed(0)
cfg = GPTConfig(n_layer=16, n_head=4, n_embd=256, block_size=256, vocab_size=65, residual='additive', norm='rmsnorm',
                activation='relu', init='sigma', tie_weights=False)
model, idx, N = GPT(cfg).eval(), torch.zeros(1, 1, dtype=torch.long), 400
for name, kwargs in [('cached', {}), ('uncached', {'use_cache': False}), ('compiled', {'compile': True})]:
    model.generate(idx, N, 0.8, 200, **kwargs)
    rates = []
    for _ in range(3):
        t0 = time.perf_counter()
        model.generate(idx, N, 0.8, 200, **kwargs)
        rates.append(N / (time.perf_counter() - t0))
    print(name, 'tokens/s, 3 rounds:', [round(r) for r in rates], flush=True)
