"""All the GPU evidence from one command: Markdown tables and a profiler trace under out-suite/.

    python tools/suite.py             # one GPU (H100 or H200)
    python tools/suite.py --runbook   # a lent GPU's first call: the fused kernels checked, then timed (7 minutes)
    python tools/suite.py --stages=compile   # its second: compile time at the GPT-2 shape, a block at a time and whole
    python tools/suite.py --smoke     # a CPU at tiny shapes: what the suite's test runs

Each stage runs in its own process with a time limit and writes OUT/<stage>.md; OUT/suite.md
gathers them, each with its command and wall time, in the form the docs' GPU sections copy.
  kernel_check         the fused kernels' tests (tests/kernels/test_hc_kernels.py) compiled on the GPU rather than
                       interpreted on a CPU: their values and gradients against the rules', before any stage times them
  selfcheck            the proof that hc_kernels='auto' makes before it runs the kernels (orthogpt/hc_kernels.py,
                       verdict), for every shape class of the suite's wide rules (HC, mHC with each H_res) at its
                       widths, x in float32 and in bfloat16: pass, or why not, a row each
  train_check          HC and mHC trained 50 steps (2 layers x 768, bfloat16) on the kernels and on the rules'
                       PyTorch, deterministic, on a random walk that a model learns: each step's loss within 1e-3
                       of the other's. A failed kernel_check, selfcheck or train_check skips the stages after it.
  step_ddp, step_fsdp  tools/bench.py at the GPT-2 124M shape (config/gpt2_124m_add.py; 8 micro-steps of
                       12 x 1024 tokens), every variant, compiled, under torchrun on one GPU as DDP
                       and as FSDP: ms/iter, tokens/s, MFU and peak memory. The batch is random
                       GPT-2 token ids (a step's speed does not depend on the data): no tokenizer,
                       no download.
  profile              a torch.profiler trace of the additive step (OUT/profile/additive.json) and
                       its top kernels with their share of the step (OUT/profile/additive.md)
  microbatch           the additive step of step_ddp (98,304 tokens) in micro-batches of 12, 24 and 48 sequences, one
                       process: which fills the GPU best (MFU), and its peak memory
  step_modern          tools/bench.py at the GPT-2 124M shape, one micro-step of 12 x 1024 tokens, compiled: additive
                       in GPT-2's block against additive, rotation and mHC in config/modern.py's (RoPE, QK norm,
                       ReLU^2, gainless norms, soft-cap, value embeddings): what the modern block costs
  kernels              tools/bench.py at the GPT-2 124M shape, one micro-step of 12 x 1024 tokens, compiled: the
                       wide streams on their fused Triton kernels (HC, mHC with each H_res constraint) and on the
                       rules' own PyTorch (HC, mHC), against additive, with MFU, peak memory and the
                       activations each saves for backward
  compile              tools/bench.py at the GPT-2 124M shape, one micro-step of 12 x 1024 tokens: additive, HC and
                       mHC compiled a block at a time (compile_scope=blocks, the default) and whole (=model), each
                       compile a cold one: the time to compile and the step, both ways (docs/performance.md,
                       "Compiling deep models"). Its own call: with the runbook it would pass a call's 10 minutes
  kernel_bw            tools/bench_kernels.py: each fused kernel's time at that shape, and the bandwidth of the bytes
                       it must move beside a device-to-device copy's
  generate             tools/bench.py --sample: tokens/s with and without the KV cache, 16 x 256, every variant, eager
  decode, decode_gpt2  the same, 500 tokens, with the compiled decoding step beside them (CUDA graphs): additive and
                       mHC at 16 x 256, additive at the GPT-2 124M shape (the generation targets, docs/performance.md)
  shakespeare          tools/compare.py: the 16 x 256 Tiny Shakespeare runs of every residual rule and mHC
                       constraint (config/shakespeare_{add,ortho,rot,ngpt,hc,mhc,mhc_identity,mhc_lite,jpmhc}.py)
                       x {standard, gated MLP (the same parameters)} x {AdamW, Muon}, the CPU recipe's grid at the paper's
                       scale, to iteration 1000 on the full run's schedule (lr_decay_iters 5000),
                       six at a time on the one GPU; the paper's best val loss lies near iteration
                       750. The smoke run takes the first rule of the grid:
                       each run is a process, whose start is most of its time on a CPU (tests/unit/test_optim.py
                       steps every rule of the grid in one process).
  miniseries           tools/miniseries.py: the CPU scaling miniseries' rules (config/shakespeare_<rule>.py:
                       additive, orthogonal, rotation, nGPT, hc, mhc) on GPT-2 BPE, FineWeb-edu's token shards
                       (--bpe_data, default data/fineweb-edu: python data/prepare_text.py --dataset fineweb-edu),
                       at depths 2-5 (n_embd 128-320, 20 tokens per block parameter: 8M to 123M tokens a run),
                       seed 1, four runs at a time: loss against compute fitted per rule, and each rule's compute
                       multiplier over additive (OUT/miniseries/miniseries.md, .json, .png). About 2e17 FLOPs,
                       by that count (not measured) 30 to 45 min of an H100: longer than one call. At its limit
                       its runs save and stop; the next --stages=miniseries call goes on from them (finished runs
                       kept) until its table appears. With no shards at --bpe_data it is skipped, saying so.
generate, decode and shakespeare read Tiny Shakespeare (--shakespeare_data, default data/shakespeare_char), prepared
there from its input.txt or the download before any stage runs; where neither is at hand they are skipped, saying so.
A lent GPU machine has no network and gets no ignored file unless it is carried: carry data/shakespeare_char/input.txt.
The stage limits add up to more than one command may run on a lent machine (10 minutes): run the stages in
calls of their own, each within it: --runbook (kernel_check,selfcheck,train_check,kernel_bw: 7 minutes),
--stages=compile (8 minutes), --stages=kernels (7 minutes), --stages=step_ddp,profile,microbatch,
--stages=step_fsdp,step_modern, --stages=generate,decode,decode_gpt2, --stages=shakespeare, --stages=miniseries. Beside each OUT/<stage>.md
lies OUT/<stage>.log, everything the stage printed.
At its limit a stage gets SIGTERM (training runs save a checkpoint and stop), and SIGKILL 45 s later (GRACE).
"""

import argparse
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, where the stages run
sys.path.insert(0, ROOT)
from orthogpt import chars, errors, logs, shards, windows  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402

GPT2 = ['config/gpt2_124m_add.py', '--gradient_accumulation_steps=8']
RULES = ('add', 'ortho', 'rot', 'ngpt', 'hc', 'mhc', 'mhc_identity', 'mhc_lite', 'jpmhc')  # config/shakespeare_<rule>.py
WIDE = ('additive', 'hc:hc_kernels=torch', 'hc:hc_kernels=triton', 'mhc:hc_kernels=torch', 'mhc:hc_kernels=triton',
        *(f'mhc:mhc_res={res}:hc_kernels=triton' for res in ('permutation', 'cayley', 'identity')))  # bench variants
MODERN = ('additive', *(f'{rule}:config/modern.py' for rule in ('additive', 'rotation', 'mhc')))  # bench variants
SERIES = ('add', 'ortho', 'rot', 'ngpt', 'hc', 'mhc')  # the miniseries' rules: config/shakespeare_<rule>.py
TEXT = ('generate', 'decode', 'shakespeare')  # the stages that read Tiny Shakespeare
TINY = ['config/owt_smoke.py', '--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=2',
        '--gradient_accumulation_steps=1', '--device=cpu']
# seconds: step_ddp's, profile's and generate's from their times on an H100 (docs/performance.md), the rest estimates
LIMITS = {'kernel_check': 90, 'selfcheck': 150, 'train_check': 120, 'kernels': 420, 'kernel_bw': 60, 'step_ddp': 420,
          'step_fsdp': 420, 'step_modern': 150, 'profile': 120,
          'microbatch': 240, 'generate': 360, 'decode': 100, 'decode_gpt2': 80, 'shakespeare': 590,
          'miniseries': 540, 'compile': 480}  # estimates: kernel_check to kernel_bw, step_modern, microbatch, decode
# to miniseries, compile
GRACE = 45  # seconds from a stage's SIGTERM at its limit to SIGKILL
CHECKS = ('kernel_check', 'selfcheck', 'train_check')  # a failed one skips the stages after it
RUNBOOK = (*CHECKS, 'kernel_bw')  # --runbook: the kernels checked on the GPU, then timed; 7 minutes by the limits
PROVED = ('hc', 'mhc', 'mhc_identity', 'mhc_lite', 'jpmhc')  # the suite's wide rules: config/shakespeare_<rule>.py
WIDTHS = (768, 256, 128, 320)  # theirs by power-of-two bucket: GPT-2's, Tiny Shakespeare's, the miniseries' (64 x 2-5)
# train_check: steps (the smoke run's two: the second loss follows one update, AdamW's first, which reads little
# more of the kernels' gradients than their signs; the kernels' own tests check the values), and how far apart the two
# runs' losses may lie, relative, on the CPU (float32) and on the GPU (bfloat16 under autocast) (docs/performance.md,
# "The GPU table")
TRAIN_STEPS, TRAIN_TOLERANCE = {'cpu': 2, 'cuda': 50}, {'cpu': 1e-5, 'cuda': 1e-3}


def random_tokens(folder, n=1 << 20, seed=0, walk=False):
    """GPT-2-vocabulary token shards of uniform random ids, for timing steps on any machine; walk: a random walk
    over 256 ids instead, each the last plus 1 to 4, which a model learns in a few dozen steps (its loss falls from
    ln 50257 towards ln 4), so that two runs whose gradients differ part."""
    os.makedirs(folder, exist_ok=True)
    g = np.random.default_rng(seed)
    for name in ('val_000000.bin', 'train_000000.bin'):
        ids = np.cumsum(g.integers(1, 5, n)) % 256 if walk else g.integers(0, 50257, n)
        shards.write(os.path.join(folder, name), ids.astype(np.uint16))
    return folder


def tiny_shakespeare(folder):
    """None where Tiny Shakespeare is prepared in folder (preparing it from its input.txt, or the download, if it is
    not yet), else why the stages that read it are skipped."""
    try:
        chars.ready(folder)
    except UserError as e:
        return (f"skipped: no Tiny Shakespeare in {folder} ({str(e).splitlines()[0]}); put its input.txt there (a "
                f"lent GPU machine has no network: carry data/shakespeare_char/input.txt), or name a folder with "
                f"--shakespeare_data=DIR")
    return None


def miniseries(out, smoke, bpe_data):
    """The miniseries stage's argv: six rules on GPT-2 BPE tokens at depths 2-5, or (smoke) two rules
    at tiny sizes on random tokens; a string saying why not where bpe_data holds no token shards."""
    if smoke:
        data, rules = random_tokens(os.path.join(out, 'data')), SERIES[:2]
        sizes = ['--depths=1,2,3', '--aspect=8', '--tokens_per_param=0', '--max_iters=4', '--eval_interval=2',
                 '--eval_iters=1', '--batch_size=2', '--block_size=16', '--device=cpu', '--compile=False', '--nproc=2']
    else:
        data, rules = bpe_data, SERIES
        sizes = ['--depths=2,3,4,5', '--block_size=1024', '--batch_size=16', '--eval_interval=500', '--eval_iters=20',
                 '--nproc=4', '--compile=True']  # compiled as before --compile=auto: its probes would pass the limit
        if windows.find(data) is None:
            return (f"skipped: {data} holds no GPT-2 token shards; prepare FineWeb-edu's with python data/prepare_text.py "
                    "--dataset fineweb-edu, or name a prepared folder with --bpe_data=DIR")
    return [sys.executable, 'tools/miniseries.py', *(f'config/shakespeare_{r}.py' for r in rules), '--seeds=1',
            f'--dataset={os.path.basename(os.path.normpath(data))}', f'--data_dir={data}',
            f'--out={os.path.join(out, "miniseries")}', *sizes]


def stages(out, smoke, shakespeare_data, bpe_data='data/fineweb-edu', chosen=()):
    """{stage: argv, or why it is skipped}: the commands of the suite, at the GPT-2 shape or (smoke) at
    tiny ones; Tiny Shakespeare prepared where a chosen stage reads it."""
    py, torchrun = [sys.executable], [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=1']
    data = [f'--data_dir={random_tokens(os.path.join(out, "data"))}', '--dataset=randtok']
    shape = TINY if smoke else [*GPT2, '--compile']
    timing = ['--steps=1', '--repeats=2', '--warmup=1'] if smoke else ['--steps=2', '--repeats=5', '--warmup=2']
    small = ['--device=cpu', '--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=16'] if smoke else []
    no_text = tiny_shakespeare(shakespeare_data or os.path.join(ROOT, 'data', 'shakespeare_char')) if set(
        TEXT) & set(chosen) else None
    sh_data = [f'--data_dir={shakespeare_data}'] if shakespeare_data else []
    # compiled on a GPU; the smoke run decodes eagerly, as compiling on a CPU takes minutes (tests/e2e/test_compile.py)
    decode = ['--sample', '--repeats=3', *(['--sample_tokens=8'] if smoke else ['--sample_tokens=500', '--compile'])]
    sequences, micro = (4, (2, 4)) if smoke else (96, (12, 24, 48))  # a step's, in micro-batches of each size
    runs = ['--max_iters=4', '--eval_interval=2', '--eval_iters=2', '--batch_size=2', '--compile=False'] if smoke else \
        ['--max_iters=1000', '--lr_decay_iters=5000', '--eval_interval=250', '--compile=True']  # no probes: in its limit
    return {
        # the smoke run takes one test (the CPU suite runs them all); on a GPU, 4 processes compile their kernels
        'kernel_check': [*py, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'tests/kernels/test_hc_kernels.py',
                         *(['-k', 'sinkhorn_per_token'] if smoke else ['-n', '4'])],
        **{check: [*py, 'tools/suite.py', f'--check={check}', f'--out={out}', *(['--smoke'] if smoke else [])]
           for check in ('selfcheck', 'train_check')},
        'step_ddp': [*torchrun, 'tools/bench.py', *shape, *data, *timing, '--parallel=ddp'],
        'step_fsdp': [*torchrun, 'tools/bench.py', *shape, *data, *timing, '--parallel=fsdp'],
        'profile': [*py, 'tools/bench.py', *shape, *data, *timing, '--variants=additive',
                    f'--profile={os.path.join(out, "profile")}'],
        'microbatch': [*py, 'tools/bench.py', *shape, *data, *timing, '--variants=' + ','.join(
            f'additive:batch_size={b}:gradient_accumulation_steps={sequences // b}' for b in micro)],
        'kernels': [*py, 'tools/bench.py', *shape, *([] if smoke else ['--gradient_accumulation_steps=1']), *data,
                    *timing, f"--variants={','.join(WIDE)}"],
        'step_modern': [*py, 'tools/bench.py', *shape, *([] if smoke else ['--gradient_accumulation_steps=1']), *data,
                        *timing, f"--variants={','.join(MODERN)}"],
        'kernel_bw': [*py, 'tools/bench_kernels.py', *(['--smoke'] if smoke else [])],
        'compile': [*py, 'tools/bench.py', *shape, *([] if smoke else ['--gradient_accumulation_steps=1']), *data,
                    *timing, '--variants=' + ','.join(f'{rule}{scope}' for rule in ('additive', 'hc', 'mhc')
                                                       for scope in ('', ':compile_scope=model'))],
        'generate': no_text or [*py, 'tools/bench.py', 'config/shakespeare_add.py', *small, *sh_data, '--sample',
                                '--repeats=1', f"--sample_tokens={8 if smoke else 500}"],
        'decode': no_text or [*py, 'tools/bench.py', 'config/shakespeare_add.py', *small, *sh_data, *decode,
                              '--variants=additive,mhc'],
        'decode_gpt2': [*py, 'tools/bench.py', *(TINY if smoke else ['config/gpt2_124m_add.py']), *data, *decode,
                        '--variants=additive'],
        'shakespeare': no_text or [*py, 'tools/compare.py',
                                   *(f'config/shakespeare_{v}.py' for v in (RULES[:1] if smoke else RULES)),
                                   '--set', 'mlp=standard,gated', '--set', 'optimizer=adamw,muon',
                                   '--mlp_ratio=None', '--seeds=1', f"--nproc={2 if smoke else 6}",
                                   f'--out={os.path.join(out, "shakespeare")}', *small, *sh_data, *runs],
        'miniseries': miniseries(out, smoke, bpe_data),
    }


def run_stage(name, argv, out, limit, env=None):
    """Run one stage; its tables go to OUT/<name>.md, all it printed to OUT/<name>.log. Returns (status, seconds)."""
    t0 = time.perf_counter()
    # a session of its own: at the limit, torchrun's workers stop with it rather than hold the GPU
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    try:
        text = proc.communicate(timeout=limit)[0]
        status = 'ok' if proc.returncode == 0 else f'failed (exit {proc.returncode})'
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # training runs save a checkpoint and stop
        try:
            text = proc.communicate(timeout=GRACE)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text = proc.communicate()[0]
        status = f'stopped at its {limit} s limit'
    with open(os.path.join(out, f'{name}.log'), 'w') as f:
        f.write(text)
    keep = [line for line in text.splitlines() if line.startswith(('|', 'cpu', 'cuda', 'wrote', '`', 'kernels', 'operators',
                                                                   '- `', 'miniseries interrupted')) or
            re.match(r'\[\d+\] |FAILED |\d+ (passed|failed)', line) or status != 'ok' and 'rror' in line]
    with open(os.path.join(out, f'{name}.md'), 'w') as f:
        f.write('\n'.join(keep) + '\n')
    return status, time.perf_counter() - t0


def selfcheck(out, smoke):
    """The selfcheck stage, in a process of its own: the kernels' proof (orthogpt.hc_kernels.verdict) for each shape
    class of the suite's wide rules at its widths, in the dtypes a run gives them (on a GPU under bfloat16 autocast:
    x in float32 at the first sublayer, in bfloat16 after); a table row each. Fails if one does."""
    import configure
    from configure.schema import model_config
    from model import RESIDUALS
    from orthogpt import hc_kernels
    device, stream = (torch.device('cpu'), torch.float32) if smoke else (torch.device('cuda:0'), torch.bfloat16)
    print('| rule | n_embd | x, stream | the kernels |\n|---|---|---|---|')
    failed = 0
    for rule, width in itertools.product(PROVED, [16] if smoke else WIDTHS):
        cfg = configure.load([f'config/shakespeare_{rule}.py', f'--n_embd={width}'])
        keys, rule_class = model_config(cfg), RESIDUALS[cfg.residual]
        spec = hc_kernels.spec(rule_class.from_config(keys, 0, True), rule_class.copies(keys))
        for dtype in dict.fromkeys((torch.float32, stream)):
            why = hc_kernels.verdict(False, spec, width, device, dtype, stream)
            failed += why is not None
            print(f"| {rule} | {width} | {str(dtype)[6:]}, {str(stream)[6:]} | "
                  f"{'pass' if why is None else why.replace('|', '/')} |", flush=True)
    if failed:
        raise UserError(f"{failed} shape class(es) failed the kernels' proof; hc_kernels='auto' runs the rules' "
                        f"PyTorch for them, and the stages after this one would time kernels that are wrong")


def train_check(out, smoke):
    """The train_check stage, in a process of its own: HC and mHC trained on the kernels (hc_kernels='triton') and
    on the rules' PyTorch, from one seed on the same batches of a random walk (random_tokens), deterministically;
    each step's loss within TRAIN_TOLERANCE of the other's, relative. A table row a rule. Fails if one is off."""
    device = 'cpu' if smoke else 'cuda'
    data = random_tokens(os.path.join(out, 'walk'), walk=True)
    shape = TINY if smoke else ['config/owt_smoke.py', '--n_layer=2', '--n_head=12', '--n_embd=768',
                                '--block_size=256', '--batch_size=8', '--gradient_accumulation_steps=1',
                                '--device=cuda', '--dtype=bfloat16']
    steps, tolerance = TRAIN_STEPS[device], TRAIN_TOLERANCE[device]
    print(f"| rule | steps | first loss | last loss | largest difference | within {tolerance:.0e} |\n"
          f"|---|---|---|---|---|---|")
    off = []
    for rule in ('hc', 'mhc'):
        fused, plain = (trained(os.path.join(out, 'train_check', f'{rule}-{kernels}'), *shape, f'--residual={rule}',
                                f'--hc_kernels={kernels}', f'--max_iters={steps}', f'--eval_interval={steps}',
                                '--eval_iters=1', '--log_interval=1', '--learning_rate=3e-3', '--deterministic=True',
                                '--compile=False', '--dataset=walk', f'--data_dir={data}')
                        for kernels in ('triton', 'torch'))
        worst = max(abs(a - b) / abs(b) for a, b in zip(fused, plain))
        ok = len(fused) == len(plain) == steps and worst <= tolerance
        off += [] if ok else [rule]
        print(f"| {rule} | {len(fused)} | {plain[0]:.4f} | {plain[-1]:.4f} | {worst:.1e} | {'yes' if ok else 'no'} |",
              flush=True)
    if off:
        raise UserError(f"{', '.join(off)} trained on the kernels part from the rules' PyTorch by more than "
                        f"{tolerance:.0e} of the loss; the stages after this one would time kernels that are wrong")


def trained(out_dir, *args):
    """Each logged training loss of python train.py args, run afresh in out_dir, in a process of its own."""
    shutil.rmtree(out_dir, ignore_errors=True)  # a run refuses a folder with another's checkpoint
    done = subprocess.run([sys.executable, 'train.py', *args, f'--out_dir={out_dir}'], cwd=ROOT)
    if done.returncode:
        raise UserError(f"train.py {' '.join(args)} failed (exit {done.returncode}); its output is above")
    return [r['loss'] for _, r in logs.parsed(os.path.join(out_dir, 'log.jsonl')) if 'loss' in r]


@errors.entry
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out', default='out-suite', help='folder for the tables and the trace')
    p.add_argument('--smoke', action='store_true', help='tiny shapes on the CPU, to check the suite itself')
    p.add_argument('--stages', default=','.join(LIMITS), help=f"a subset of {','.join(LIMITS)}")
    p.add_argument('--runbook', action='store_true', help=f"--stages={','.join(RUNBOOK)}: a lent GPU's first call")
    p.add_argument('--shakespeare_data', default=None, help='a folder with Tiny Shakespeare (default data/shakespeare_char)')
    p.add_argument('--bpe_data', default='data/fineweb-edu', help='GPT-2 token shards for the miniseries stage')
    p.add_argument('--check', choices=CHECKS[1:], help=argparse.SUPPRESS)  # that stage, in its own process
    args = p.parse_args(argv)
    args.out = os.path.abspath(args.out)  # the stages run in the repository, the paths given are the caller's
    args.shakespeare_data = args.shakespeare_data and os.path.abspath(args.shakespeare_data)
    if args.check:
        return (selfcheck if args.check == 'selfcheck' else train_check)(args.out, args.smoke)
    chosen = list(RUNBOOK) if args.runbook else args.stages.split(',')
    unknown = set(chosen) - set(LIMITS)
    if unknown:
        raise UserError(f"unknown stage(s) {sorted(unknown)}; choose from {', '.join(LIMITS)}")
    if not args.smoke and not torch.cuda.is_available():
        raise UserError("the suite measures a GPU and sees none; python tools/suite.py --smoke checks it on a CPU")
    os.makedirs(args.out, exist_ok=True)
    machine = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.smoke else 'CPU (smoke)'
    report = [f"# GPU suite: {machine}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}", '']
    commands = stages(args.out, args.smoke, args.shakespeare_data, args.bpe_data, chosen)
    failed = None  # the first check that failed: the stages after it would time kernels that are wrong
    for name in chosen:
        skipped = f"skipped: {failed} failed" if failed else commands[name] if isinstance(commands[name], str) else None
        if skipped:
            print(f"{name}: {skipped}")
            report += [f"## {name}", '', skipped, '']
            continue
        # the kernels interpreted on a CPU, compiled on a GPU (the tests' default is the interpreter)
        status, seconds = run_stage(name, commands[name], args.out, LIMITS[name] * (4 if args.smoke else 1),
                                    dict(os.environ, TRITON_INTERPRET='1' if args.smoke else '0'))
        print(f"{name}: {status}, {seconds:.0f} s")
        failed = failed or (name if name in CHECKS and status != 'ok' else None)
        with open(os.path.join(args.out, f'{name}.md')) as f:
            report += [f"## {name}", '', f"`{' '.join(commands[name][1:])}`: {status}, {seconds:.0f} s", '', f.read()]
    with open(os.path.join(args.out, 'suite.md'), 'w') as f:
        f.write('\n'.join(report))
    print(f"wrote {os.path.join(args.out, 'suite.md')}")


if __name__ == '__main__':
    main()
