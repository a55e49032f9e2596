"""What two other choices of the read and backward kernels would take, compiled for compute capability 9.0 and 8.9 on
a CPU (tools/bench_kernels.py's compile mode): the read pipelined 3 deep on a float32 stream (the kernels before commit
90b09c0), and the three largest backward kernels at 8 warps a program instead of 4.

    python docs/logs/kernels_compile/variants.py > docs/logs/kernels_compile/variants.txt
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'tools')]

import torch  # noqa: E402
from triton.runtime import jit  # noqa: E402

import bench_kernels  # noqa: E402
from orthogpt import hc_kernels  # noqa: E402

print('| capability | stream | call | variant | registers | stack, bytes | shared memory, bytes |\n|---|---|---|---|---|---|---|')
for capability in (90, 89):
    with bench_kernels.compiled_for(capability) as launched:
        launch = jit.KernelInterface.__getitem__
        for stream, (dtype, arithmetic) in bench_kernels.STREAMS.items():
            torch.set_float32_matmul_precision(arithmetic)
            calls = bench_kernels.cases(12 * 1024, 4, 768, dtype, 'cpu')
            variants = {'read, mHC (RMSNorm, vec(H) phi)': ('3 stages', lambda: setattr(hc_kernels, 'stages', lambda H: 3)),
                        'read, HC (LayerNorm per copy)': ('3 stages', lambda: setattr(hc_kernels, 'stages', lambda H: 3))}
            eight = ('8 warps', lambda: setattr(jit.KernelInterface, '__getitem__', lambda k, g: (
                lambda *a, **kw: launch(k, g)(*a, **{**kw, 'num_warps': 8}))))
            variants.update({name: eight for name in ('write, backward', 'read, mHC, backward', 'read, HC, backward')})
            for name, (variant, change) in variants.items():
                stages = hc_kernels.stages
                change()
                del launched[:]
                calls[name][0]()
                hc_kernels.stages, jit.KernelInterface.__getitem__ = stages, launch
                regs, stack = bench_kernels.resources(launched[0][1])
                print(f"| {capability} | {stream} | {name} | {variant} | {regs} | {stack} | {launched[0][1].metadata.shared} |")
