"""The fused kernels of the wide streams compiled for an H100 on this machine, which has no GPU: tools/bench_kernels.py
--compile_for=90 builds every kernel in every mode for each stream dtype (float32 with IEEE and TF32 products) with
Triton's own compiler and ptxas. Triton's interpreter, which runs the kernels' other tests, accepts code that a GPU's
compiler rejects: the kernels once read plain integer globals, which every launch on a GPU refused."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT

kernels = pytest.importorskip('orthogpt.hc_kernels')

H100_SHARED = 232448  # bytes of shared memory a block may take on an H100 (227 KiB); a kernel that needs more cannot launch


def test_every_kernel_compiles_for_an_h100(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['TRITON_CACHE_DIR'] = str(tmp_path)  # compiled here, not read from an earlier run
    done = subprocess.run([sys.executable, 'tools/bench_kernels.py', '--compile_for=90'], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [line.strip('| ').split(' | ') for line in done.stdout.splitlines() if line.startswith('| ')][1:]
    assert {row[1] for row in rows} == {'bfloat16', 'float16', 'float32, TF32', 'float32, IEEE'}
    assert {row[2] for row in rows} == {name for name in dir(kernels) if name.endswith('_kernel')}  # each one launched
    assert len(rows) == 4 * len({row[0] for row in rows})  # every mode in each stream
    for name, dtype, kernel, registers, stack, shared in rows:
        assert 0 < int(registers) <= 255 and 0 <= int(shared) <= H100_SHARED, (name, dtype)
