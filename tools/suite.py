"""All the GPU evidence from one command: Markdown tables and a profiler trace under out-suite/.

    python tools/suite.py             # one GPU (H100 or H200)
    python tools/suite.py --smoke     # a CPU at tiny shapes: what the suite's test runs

Each stage runs in its own process with a time limit and writes OUT/<stage>.md; OUT/suite.md
gathers them, each with its command and wall time, in the form the docs' GPU sections copy.
  step_ddp, step_fsdp  tools/bench.py at the GPT-2 124M shape (config/gpt2_124m_add.py; 8 micro-steps of
                       12 x 1024 tokens), every variant, compiled, under torchrun on one GPU as DDP
                       and as FSDP: ms/iter, tokens/s, MFU and peak memory. The batch is random
                       GPT-2 token ids (a step's speed does not depend on the data): no tokenizer,
                       no download.
  profile              a torch.profiler trace of the additive step (OUT/profile/additive.json) and
                       its top kernels with their share of the step (OUT/profile/additive.md)
  wide                 tools/bench.py at the GPT-2 124M shape, one micro-step, compiled: the wide streams
                       (HC, mHC with each H_res constraint, with and without hc_recompute) against
                       additive, with the activations each saves for backward
  generate             tools/bench.py --sample: tokens/s with and without the KV cache, 16 x 256
  shakespeare          tools/compare.py: the 16 x 256 Tiny Shakespeare runs of every residual rule and mHC
                       constraint (config/shakespeare_{add,ortho,rot,ngpt,hc,mhc,mhc_identity,mhc_lite,jpmhc}.py)
                       x {standard, gated MLP (the same parameters)} x {AdamW, Muon}, the CPU recipe's grid at the paper's
                       scale, to iteration 1000 on the full run's schedule (lr_decay_iters 5000),
                       six at a time on the one GPU; the paper's best val loss lies near iteration
                       750. Tiny Shakespeare must be prepared or at data/shakespeare_char/input.txt
                       (a lent GPU machine has no network).
The stage limits add up to more than one command may run on a lent machine (10 minutes): run the wide and
shakespeare stages as calls of their own (--stages=wide, --stages=shakespeare).
"""

import argparse
import os
import signal
import subprocess
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, where the stages run
sys.path.insert(0, ROOT)
from orthogpt import errors, shards  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402

GPT2 = ['config/gpt2_124m_add.py', '--gradient_accumulation_steps=8']
RULES = ('add', 'ortho', 'rot', 'ngpt', 'hc', 'mhc', 'mhc_identity', 'mhc_lite', 'jpmhc')  # config/shakespeare_<rule>.py
WIDE = ('additive', 'hc', 'hc:hc_recompute=True', 'mhc', 'mhc:hc_recompute=True', 'mhc:mhc_res=identity',
        'mhc:mhc_res=permutation', 'mhc:mhc_res=cayley')  # tools/bench.py variants
TINY = ['config/owt_smoke.py', '--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=2',
        '--gradient_accumulation_steps=1', '--device=cpu']
LIMITS = {'step_ddp': 210, 'step_fsdp': 180, 'profile': 60, 'wide': 590, 'generate': 60, 'shakespeare': 590}  # seconds


def random_tokens(folder, n=1 << 20, seed=0):
    """GPT-2-vocabulary token shards of uniform random ids, for timing steps on any machine."""
    os.makedirs(folder, exist_ok=True)
    g = np.random.default_rng(seed)
    for name in ('val_000000.bin', 'train_000000.bin'):
        shards.write(os.path.join(folder, name), g.integers(0, 50257, n, dtype=np.uint16))
    return folder


def stages(out, smoke, shakespeare_data):
    """{stage: argv}: the commands of the suite, at the GPT-2 shape or (smoke) at tiny ones."""
    py, torchrun = [sys.executable], [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=1']
    data = [f'--data_dir={random_tokens(os.path.join(out, "data"))}', '--dataset=randtok']
    shape = TINY if smoke else [*GPT2, '--compile']
    timing = ['--steps=1', '--repeats=2', '--warmup=1'] if smoke else ['--steps=2', '--repeats=5', '--warmup=2']
    small = ['--device=cpu', '--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=16'] if smoke else []
    sh_data = [f'--data_dir={shakespeare_data}'] if shakespeare_data else []
    runs = ['--max_iters=4', '--eval_interval=2', '--eval_iters=2', '--batch_size=2', '--compile=False'] if smoke else \
        ['--max_iters=1000', '--lr_decay_iters=5000', '--eval_interval=250']
    return {
        'step_ddp': [*torchrun, 'tools/bench.py', *shape, *data, *timing, '--parallel=ddp'],
        'step_fsdp': [*torchrun, 'tools/bench.py', *shape, *data, *timing, '--parallel=fsdp'],
        'profile': [*py, 'tools/bench.py', *shape, *data, *timing, '--variants=additive',
                    f'--profile={os.path.join(out, "profile")}'],
        'wide': [*py, 'tools/bench.py', *shape, *([] if smoke else ['--gradient_accumulation_steps=1']), *data, *timing,
                 f"--variants={','.join(WIDE)}"],
        'generate': [*py, 'tools/bench.py', 'config/shakespeare_add.py', *small, *sh_data, '--sample', '--repeats=1',
                     f"--sample_tokens={8 if smoke else 500}"],
        'shakespeare': [*py, 'tools/compare.py', *(f'config/shakespeare_{v}.py' for v in RULES),
                        '--set', 'mlp=standard,gated', '--set', 'optimizer=adamw,muon', '--mlp_ratio=None',
                        '--seeds=1', f"--nproc={2 if smoke else 6}", f'--out={os.path.join(out, "shakespeare")}',
                        *small, *sh_data, *runs],
    }


def run_stage(name, argv, out, limit):
    """Run one stage; its output goes to OUT/<name>.md. Returns (status, seconds)."""
    t0 = time.perf_counter()
    # a session of its own: at the limit, torchrun's workers stop with it rather than hold the GPU
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        text = proc.communicate(timeout=limit)[0]
        status = 'ok' if proc.returncode == 0 else f'failed (exit {proc.returncode})'
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, status = proc.communicate()[0], f'stopped at its {limit} s limit'
    keep = [line for line in text.splitlines() if line.startswith(('|', 'cpu', 'cuda', 'wrote', '`', 'kernels', 'operators')) or
            status != 'ok' and 'rror' in line]
    with open(os.path.join(out, f'{name}.md'), 'w') as f:
        f.write('\n'.join(keep) + '\n')
    return status, time.perf_counter() - t0


@errors.entry
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out', default='out-suite', help='folder for the tables and the trace')
    p.add_argument('--smoke', action='store_true', help='tiny shapes on the CPU, to check the suite itself')
    p.add_argument('--stages', default=','.join(LIMITS), help=f"a subset of {','.join(LIMITS)}")
    p.add_argument('--shakespeare_data', default=None, help='a folder with Tiny Shakespeare (default data/shakespeare_char)')
    args = p.parse_args(argv)
    unknown = set(args.stages.split(',')) - set(LIMITS)
    if unknown:
        raise UserError(f"unknown stage(s) {sorted(unknown)}; choose from {', '.join(LIMITS)}")
    if not args.smoke and not torch.cuda.is_available():
        raise UserError("the suite measures a GPU and sees none; python tools/suite.py --smoke checks it on a CPU")
    os.makedirs(args.out, exist_ok=True)
    machine = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.smoke else 'CPU (smoke)'
    report = [f"# GPU suite: {machine}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}", '']
    commands = stages(args.out, args.smoke, args.shakespeare_data)
    for name in args.stages.split(','):
        status, seconds = run_stage(name, commands[name], args.out, LIMITS[name] * (4 if args.smoke else 1))
        print(f"{name}: {status}, {seconds:.0f} s")
        with open(os.path.join(args.out, f'{name}.md')) as f:
            report += [f"## {name}", '', f"`{' '.join(commands[name][1:])}`: {status}, {seconds:.0f} s", '', f.read()]
    with open(os.path.join(args.out, 'suite.md'), 'w') as f:
        f.write('\n'.join(report))
    print(f"wrote {os.path.join(args.out, 'suite.md')}")


if __name__ == '__main__':
    main()
