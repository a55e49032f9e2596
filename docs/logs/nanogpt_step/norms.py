"""The norm a block runs twice a layer, forward and backward, eager, at the CPU recipe's shape (12 x 64 x 128, one
thread): the paper's RMSNorm (torch.nn.functional.rms_norm), the same map through F.normalize, and nanoGPT's
LayerNorm. Median over 15 interleaved rounds of 50 calls. python docs/logs/nanogpt_step/norms.py"""
import math
import statistics
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
x0, w, b = torch.randn(12, 64, 128), torch.ones(128, requires_grad=True), torch.zeros(128, requires_grad=True)
NORMS = {'rms_norm': lambda x: F.rms_norm(x, (128,), w, torch.finfo(x.dtype).eps),
         'normalize x sqrt(d)': lambda x: F.normalize(x, dim=-1) * math.sqrt(128) * w,
         'layer_norm': lambda x: F.layer_norm(x, (128,), w, b, 1e-5)}
times = {k: [] for k in NORMS}
for _ in range(15):
    for k, f in NORMS.items():
        t0 = time.perf_counter()
        for _ in range(50):
            f(x0.clone().requires_grad_()).sum().backward()
        times[k].append((time.perf_counter() - t0) / 50)
for k, ts in times.items():
    print(f"{k}: {statistics.median_high(ts) * 1e6:.0f} us forward + backward")
