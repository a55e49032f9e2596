"""What two other choices of the read and backward kernels would take, compiled on a CPU for the compute capability
given (tools/bench_kernels.py's compile mode; one capability a process): the reads pipelined 3 deep whatever the
stream (the kernels before commit 90b09c0), and the three largest backward kernels at 8 warps a program instead of 4.

    python docs/logs/kernels_compile/variants.py 90 > docs/logs/kernels_compile/variants90.txt
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'tools')]

import torch  # noqa: E402
from triton.runtime import jit  # noqa: E402

import bench_kernels  # noqa: E402
from orthogpt import hc_kernels  # noqa: E402

capability = int(sys.argv[1])
stages = hc_kernels.stages
print('| capability | stream | call | variant | registers | stack, bytes | shared memory, bytes |\n'
      '|---|---|---|---|---|---|---|')
with bench_kernels.compiled_for(capability) as launched:
    launch = jit.KernelInterface.__getitem__  # compiles, and runs nothing
    three_stages = ('3 stages', lambda: setattr(hc_kernels, 'stages', lambda H: 3))
    eight_warps = ('8 warps', lambda: setattr(jit.KernelInterface, '__getitem__', lambda kernel, grid: (
        lambda *args, **kwargs: launch(kernel, grid)(*args, **{**kwargs, 'num_warps': 8}))))
    variants = {'read, mHC (RMSNorm, vec(H) phi)': three_stages, 'read, HC (LayerNorm per copy)': three_stages,
                'write, backward': eight_warps, 'read, mHC, backward': eight_warps, 'read, HC, backward': eight_warps}
    for stream, (dtype, arithmetic) in bench_kernels.STREAMS.items():
        torch.set_float32_matmul_precision(arithmetic)
        calls = bench_kernels.cases(12 * 1024, 4, 768, dtype, 'cpu')
        for name, (variant, change) in variants.items():
            change()
            del launched[:]
            calls[name][0]()
            hc_kernels.stages, jit.KernelInterface.__getitem__ = stages, launch
            (kernel, compiled), = launched
            regs, stack = bench_kernels.resources(compiled)
            print(f"| {capability} | {stream} | {name} | {variant} | {regs} | {stack} | {compiled.metadata.shared} |")
