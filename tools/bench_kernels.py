"""The fused kernels of the wide streams (orthogpt/hc_kernels.py) against the bytes they must move: each one's time,
the bytes of its inputs read once and its outputs written once, and the bandwidth that gives beside a
device-to-device copy's of the stream, at the GPT-2 124M shape (12 x 1024 tokens, n = 4 copies of 768).

    python tools/bench_kernels.py                 # a CUDA GPU, the stream in bfloat16
    python tools/bench_kernels.py --smoke         # tiny shapes on a CPU under Triton's interpreter: the script runs
    python tools/bench_kernels.py --compile_for=90    # no GPU needed: each kernel compiled for Hopper, not run

Each kernel is timed over --repeats calls after --warmup (CUDA events; the median), at the shapes one sublayer of
training gives it: mHC with Sinkhorn's mixing, mHC's identity H_res, HC, and a static rule's given weights, forward
(the read, the write) and backward.

--compile_for=CC compiles every kernel those calls launch, for each stream dtype (float32 with IEEE products, torch's
default, and with TF32, train.py's on CUDA), for an NVIDIA GPU of compute capability CC (80: A100, 90: H100 and H200)
with the compiler and ptxas that triton ships, on a machine with no GPU. It prints each one's registers a thread,
stack frame (a kernel at the 255-register limit spills into it), shared memory, and whether its products run on
tensor cores (mma in its PTX): what Triton's interpreter, which runs the tests on a CPU, does not check (it reads
globals that a GPU's compiler refuses).
"""

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

if '--smoke' in sys.argv:  # before Triton defines the kernels
    os.environ.setdefault('TRITON_INTERPRET', '1')

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from orthogpt import errors  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402


def timed(fn, repeats, warmup, cuda):
    """Median seconds of fn() over repeats calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median_high(times)


def nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def backward_args(outputs):
    """hc_read's outputs (h, z, read, S1, S2) as hc_read_backward takes them: z, S1, S2, read."""
    h, z, read, s1, s2 = outputs
    return z, s1, s2, read


def backward_bytes(dh, H, weight, outputs):
    """The read's backward: dh, dz, H, z, its statistics, the read weights and the weight in; dH, the read weights'
    gradient and dz out."""
    z, s1, s2, read = backward_args(outputs)
    return nbytes(dh, z, H, z, s1, s2, read, weight) + nbytes(H, read, z)


def cases(N, n, d, dtype, device):
    """{name: (call, the bytes it reads and writes at the least)} for one sublayer's kernels, each mode of each."""
    from orthogpt import hc_kernels as K
    f32 = dict(dtype=torch.float32, device=device)
    g = torch.Generator(device=device).manual_seed(0)
    H = torch.randn(N, n, d, generator=g, device=device).to(dtype)
    u = torch.randn(N, d, generator=g, device=device).to(dtype)
    m = 2 * n + n * n
    phi, W = torch.randn(n * d, m, generator=g, **f32) * 1e-2, torch.randn(d, n + 2, generator=g, **f32) * 1e-2
    a, b, none = torch.full((1,), 0.01, **f32), torch.zeros(n, **f32), torch.empty(0, **f32)
    res = torch.softmax(torch.randn(N, n, n, generator=g, **f32), -1)
    post = torch.rand(N, n, generator=g, **f32)
    given = torch.rand(n, generator=g, **f32).expand(N, n)  # a static rule's read weights, as Fused.prepare gives them
    rms = K.hc_read(H, none, phi, none, none, a, b, K.RMS, 1e-20)
    ln = K.hc_read(H, none, W, W.sum(0), W.sum(0), a, b, K.LAYERNORM, 1e-5)
    dout, dh = torch.randn_like(H), torch.randn_like(u)
    logits = torch.randn(N, n, n, generator=g, **f32)
    copy = torch.empty_like(H)
    return {
        'copy of the stream (reference)': (lambda: copy.copy_(H), 2 * nbytes(H)),
        'read, mHC (RMSNorm, vec(H) phi)': (lambda: K.hc_read(H, none, phi, none, none, a, b, K.RMS, 1e-20),
                                            nbytes(H, phi, *rms)),
        'read, HC (LayerNorm per copy)': (lambda: K.hc_read(H, none, W, W.sum(0), W.sum(0), a, b, K.LAYERNORM, 1e-5),
                                          nbytes(H, W, *ln)),
        'read, static (given weights)': (lambda: K.hc_read(H, given, none, none, none, none, none, K.NONE, 0.0),
                                         nbytes(H, u)),
        'write (H_res H + H_post u)': (lambda: K.hc_write(H, u, res, post, dtype), nbytes(H, u, res, post, H)),
        'write, identity H_res': (lambda: K.hc_write(H, u, None, post, dtype), nbytes(H, u, post, H)),
        'write, backward': (lambda: K.hc_write_backward(dout, H, u, res, post),
                            nbytes(dout, H, u, res, post, H, u, res, post)),
        'write, identity H_res, backward': (lambda: K.hc_write_backward(dout, H, u, None, post),
                                            nbytes(dout, u, post, H, u, post)),  # dH = dout: H is not read
        'read, mHC, backward': (lambda: K.hc_read_backward(dh, rms[1], H, *backward_args(rms), phi, none, none, a,
                                                           K.RMS), backward_bytes(dh, H, phi, rms)),
        'read, HC, backward': (lambda: K.hc_read_backward(dh, ln[1], H, *backward_args(ln), W, W.sum(0), W.sum(0), a,
                                                          K.LAYERNORM), backward_bytes(dh, H, W, ln)),
        'read, static, backward': (lambda: K.hc_read_backward(dh, none, H, none, none, none, given, none, none, none,
                                                              none, K.NONE), nbytes(dh, H, H) + nbytes(given)),
        "phi's gradient (X^T Y)": (lambda: K.hc_xty(H.view(N, -1), rms[1]), nbytes(H, rms[1], phi)),
        'Sinkhorn-Knopp, 20 rounds': (lambda: K.hc_sinkhorn(logits, 20), nbytes(logits, logits)),
        'Sinkhorn-Knopp, backward': (lambda: K.hc_sinkhorn_backward(logits, logits, 20), 3 * nbytes(logits)),
    }


@contextlib.contextmanager
def compiled_for(capability):
    """Inside, a Triton launch compiles its kernel for an NVIDIA GPU of this compute capability and does not run it:
    Triton's driver is one that names that GPU, here or not. Yields the list of (kernel's name, CompiledKernel) that
    the launches fill. Once a process: each kernel keeps the target of its first launch (Triton caches it)."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver, jit

    class Absent:  # the driver calls a launch makes before it compiles
        def get_current_target(self):
            return GPUTarget('cuda', capability, 32)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

    launched = []

    def launch(kernel, grid):
        return lambda *args, **kwargs: launched.append((kernel.__name__, kernel.warmup(*args, grid=grid, **kwargs)))

    getitem, active = jit.KernelInterface.__getitem__, driver._active  # None until a launch looks for a GPU
    driver.set_active(Absent())
    jit.KernelInterface.__getitem__ = launch
    try:
        yield launched
    finally:
        jit.KernelInterface.__getitem__ = getitem
        driver.set_active(active)


def resources(compiled):
    """(registers a thread, stack frame bytes) of a CompiledKernel's binary, as cuobjdump reads them."""
    import triton
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(compiled.asm['cubin'])
        f.flush()
        usage = subprocess.run([triton.knobs.nvidia.cuobjdump.path, '--dump-resource-usage', f.name],
                               capture_output=True, text=True, check=True).stdout
    return tuple(int(re.search(rf'\b{key}:(\d+)', usage).group(1)) for key in ('REG', 'STACK'))


# the streams a run gives the kernels, with the float32 products' arithmetic: IEEE, torch's default; TF32, what
# train.py sets on CUDA for a float32 run (orthogpt.parallel)
STREAMS = {'bfloat16': (torch.bfloat16, 'highest'), 'float16': (torch.float16, 'highest'),
           'float32, TF32': (torch.float32, 'high'), 'float32, IEEE': (torch.float32, 'highest')}


def compile_all(N, n, d, capability):
    """Every kernel of cases() compiled for capability, for each stream of STREAMS: a Markdown table."""
    print(f"compiled for compute capability {capability} (not run); {N} tokens x {n} copies x {d}\n\n"
          f"| call | stream | kernel | registers | stack, bytes | shared memory, bytes | tensor cores |\n"
          f"|---|---|---|---|---|---|---|")
    previous = torch.get_float32_matmul_precision()
    try:
        with compiled_for(capability) as launched:
            for stream, (dtype, arithmetic) in STREAMS.items():
                torch.set_float32_matmul_precision(arithmetic)
                for name, (call, _) in cases(N, n, d, dtype, 'cpu').items():
                    if name.startswith('copy'):
                        continue
                    del launched[:]
                    call()
                    for kernel, compiled in launched:
                        regs, stack = resources(compiled)
                        cores = 'yes' if re.search(r'\b(wgmma|mma)\.', compiled.asm['ptx']) else 'no'
                        print(f"| {name} | {stream} | {kernel} | {regs} | {stack} | {compiled.metadata.shared} | "
                              f"{cores} |")
    finally:
        torch.set_float32_matmul_precision(previous)


@errors.entry
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--smoke', action='store_true', help='tiny shapes on a CPU under Triton\'s interpreter')
    p.add_argument('--tokens', type=int, default=12 * 1024)
    p.add_argument('--copies', type=int, default=4)
    p.add_argument('--n_embd', type=int, default=768)
    p.add_argument('--dtype', default='bfloat16', choices=['bfloat16', 'float32'])
    p.add_argument('--repeats', type=int, default=20)
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--compile_for', type=int, metavar='CC',
                   help='compile each kernel for an NVIDIA GPU of compute capability CC (90: Hopper), with no GPU here')
    args = p.parse_args(argv)
    if args.compile_for is not None:
        if os.environ.get('TRITON_INTERPRET') == '1':
            raise UserError("--compile_for compiles the kernels for a GPU, which Triton's interpreter does not: unset "
                            "TRITON_INTERPRET (and leave out --smoke)")
        return compile_all(args.tokens, args.copies, args.n_embd, args.compile_for)
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        raise UserError("the kernels run on a CUDA GPU and this machine has none; --smoke runs the script at tiny "
                        "shapes on a CPU under Triton's interpreter")
    from orthogpt.hc_kernels import interpreter_fault
    fault = interpreter_fault() if args.smoke else None
    if fault:
        raise UserError(fault)
    N, n, d = (20, 3, 72) if args.smoke else (args.tokens, args.copies, args.n_embd)
    repeats, warmup = (1, 1) if args.smoke else (args.repeats, args.warmup)
    dtype = getattr(torch, args.dtype)
    device = 'cuda' if cuda else 'cpu'
    print(f"{torch.cuda.get_device_name() if cuda else 'cpu (smoke: interpreted, not a timing)'}, torch "
          f"{torch.__version__}; {N} tokens x {n} copies x {d}, stream {args.dtype}; median of {repeats} calls")
    print('\n| kernel | MB moved (least) | µs | GB/s | of the copy\'s |\n|---|---|---|---|---|')
    rate = None
    for name, (call, moved) in cases(N, n, d, dtype, device).items():
        seconds = timed(call, repeats, warmup, cuda)
        rate = moved / seconds / 1e9 if rate is None else rate  # the copy's, first
        print(f"| {name} | {moved / 1e6:.1f} | {seconds * 1e6:.1f} | {moved / seconds / 1e9:.0f} | "
              f"{moved / seconds / 1e9 / rate:.0%} |")


if __name__ == '__main__':
    main()
