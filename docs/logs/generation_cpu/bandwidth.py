"""The rate at which this machine reads memory, as docs/performance.md's decoding floor takes it: the sum of a 50 MiB
float32 tensor (beyond a 32 MiB L3), three untimed sums, then the mean of ten, on torch's threads and on one.

    python docs/logs/generation_cpu/bandwidth.py
"""
import time

import torch

x = torch.randn(50 * 2**20 // 4)
for threads in (torch.get_num_threads(), 1):
    torch.set_num_threads(threads)
    for _ in range(3):
        x.sum()
    t0 = time.perf_counter()
    for _ in range(10):
        x.sum()
    print(f"{threads} thread(s): {x.numel() * 4 / ((time.perf_counter() - t0) / 10) / 1e9:.1f} GB/s", flush=True)
