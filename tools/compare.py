"""Run configs x seeds x settings with train.py and compare them in one table and one figure.

    python tools/compare.py config/shakespeare_add.py config/shakespeare_rot.py --stack=config/cpu.py \\
        --seeds=3 --set sigma_w=0.25,0.5,1.0 --out=compare-sigma
    python tools/compare.py config/vit_fashion_add.py config/vit_fashion_ortho.py --seeds=3 --nproc=2

Every run is `python train.py CONFIG [STACK ...] [--key=value ...] --seed=S --out_dir=OUT/NAME` in
its own process and folder; extra --key=value arguments go to every run, --set key=v1,v2 makes
one group per value (several --set: every combination). Seeds are 1337, 1, 2, ... (1337 is
train.py's default). A run is finished when its log holds the evaluation at max_iters: finished
runs are not rerun, interrupted ones resume from their checkpoint, failed ones start again.
--nproc runs that many at once (CPU threads are split between them; with several GPUs each run
gets one, in turn). Ctrl-C or SIGTERM stops the runs at their next step with a checkpoint.

Switching mid-training (G. Oh et al., "Revisiting Residual Connections: Orthogonal Updates for
Stable and Efficient Deep Networks", NeurIPS 2025, arXiv:2505.11881, Sec. 4.3 and App. C.3: L->O
and O->L):
    python tools/compare.py config/vit_fashion_add.py config/vit_fashion_ortho.py --seeds=3 \\
        --switch residual=additive,orthogonal --switch_at=1300 [--switch_reset]
trains each config x setting x seed once up to --switch_at (folder NAME-first<ITER>-sS), then
continues a copy of that run to max_iters once per --switch value (one group per value, so the
example gives L->L, L->O, O->L and O->O from two first phases). Without --switch_reset the first
phase keeps the full run's learning-rate schedule and the second continues it with the same AdamW
state (App. C.3); with it the first phase is a complete run of --switch_at iterations (its
schedule decays there) and the second restarts AdamW and the schedule, warmup included (Sec. 4.3).

Writes OUT/results.md: a row per config x setting (x switch value), mean +- sample std over its
finished seeds of the best and the final validation loss (and the final top-1 / top-5 for
images), the median tokens/s or images/s of the training log lines, and the mean wall time of
the runs (the invocation that finished each, plus its first phase). A run that failed or did
not finish is named under the table with its exit status and the last lines it printed.
OUT/curves.png: validation loss (and top-1 for images) against iteration, mean over seeds, a
line per row (a dashed line at --switch_at).
"""

import argparse
import filecmp
import itertools
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: train.py
sys.path.insert(0, ROOT)
import configure  # noqa: E402
from orthogpt import errors, logs, plots, resume  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402

SEEDS = [1337] + list(range(1, 100))


def parse_set(text):
    key, sep, values = text.partition('=')
    if not sep or not values:
        raise UserError(f"--set {text!r}: write --set key=v1,v2,...")
    return [(key, v) for v in values.split(',')]


def parse_per(text):
    """--per CONFIG:KEY=VALUE, a setting for one config's runs alone: (config stem, (key, value))."""
    stem, colon, kv = text.partition(':')
    key, eq, value = kv.partition('=')
    if not colon or not eq or not key or not value:
        raise UserError(f"--per {text!r}: write --per CONFIG:key=value (CONFIG: a config file's name)")
    return os.path.splitext(os.path.basename(stem))[0], (key, value)


def load(argv, name):
    try:
        return configure.load(argv)
    except UserError as e:
        raise UserError(f"{e} (run {name})") from None


def plan(args, extra):
    """One dict per run: its group (config x setting, None for a first phase), seed, name, argv,
    out_dir and, for a second phase, the first phase it continues (`after`); each argv checked
    with configure.load first, so a typo stops the comparison before any run starts."""
    settings = list(itertools.product(*[parse_set(s) for s in args.set])) or [()]
    switches = list(itertools.product(*[parse_set(s) for s in args.switch])) if args.switch else []
    runs = []

    def add(group, seed, name, argv, **extra_fields):
        if any(r['name'] == name for r in runs):
            raise UserError(f"two runs would share the folder {name}: give the configs distinct file names")
        out_dir = os.path.join(args.out, name)
        argv = [*argv, f'--seed={seed}', f'--out_dir={out_dir}']
        runs.append(dict(group=group, seed=seed, name=name, argv=argv, out_dir=out_dir, cfg=load(argv, name),
                         **extra_fields))
        return runs[-1]

    per = [parse_per(p) for p in args.per]
    for config in args.configs:
        name = os.path.splitext(os.path.basename(config))[0]
        for setting in settings:
            setting = (*(kv for stem, kv in per if stem == name), *setting)
            label = name + ''.join(f" {k}={v}" for k, v in setting)
            stem = label.replace(' ', '-').replace('=', '')
            argv = [config, *args.stack, *extra, *(f'--{k}={v}' for k, v in setting)]
            for seed in SEEDS[:args.seeds]:
                if not switches:
                    add(label, seed, f'{stem}-s{seed}', argv)
                    continue
                cfg = load(argv, stem)
                if not 0 < args.switch_at < cfg.max_iters:
                    raise UserError(f"--switch_at={args.switch_at} must lie between 0 and max_iters={cfg.max_iters}")
                decay = cfg.max_iters if cfg.lr_decay_iters is None else cfg.lr_decay_iters
                first = add(None, seed, f'{stem}-first{args.switch_at}-s{seed}',
                            [*argv, f'--max_iters={args.switch_at}',
                             f'--lr_decay_iters={args.switch_at if args.switch_reset else decay}'])
                for switch in switches:
                    run = add(label + ' → ' + ' '.join(f"{k}={v}" for k, v in switch), seed,
                              f"{stem}-then-{'-'.join(f'{k}{v}' for k, v in switch)}-s{seed}",
                              [*argv, *(f'--{k}={v}' for k, v in switch), f'--lr_decay_iters={decay}'],
                              after=first, reset=args.switch_reset)
                    problems = resume.problems(first['cfg'], run['cfg'])
                    if problems:
                        raise UserError(f"--switch: {run['name']} cannot continue {first['name']}: "
                                         + '; '.join(problems))
    return runs


def finished(run):
    return any(r['iter'] == run['cfg'].max_iters and 'val_loss' in r for r in logs.read(run['out_dir']))


def execute(runs, nproc):
    """Run the unfinished runs, nproc at a time; records each one's exit status and wall time."""
    todo = [r for r in runs if not finished(r)]
    for r in runs:
        if r not in todo:
            print(f"{r['name']}: finished before, kept")
    env = dict(os.environ)
    env.setdefault('OMP_NUM_THREADS', str(max(1, (os.cpu_count() or 1) // nproc)))
    gpus = torch.cuda.device_count()
    running = []

    def terminate(signum, frame):  # Ctrl-C in a terminal reaches the runs by itself, SIGTERM does not
        for r in running:
            r['proc'].terminate()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    try:
        launch(todo, running, nproc, env, gpus)
    except KeyboardInterrupt:  # let the runs save their checkpoints
        for r in running:
            r['proc'].wait()
        raise SystemExit("interrupted; the same command resumes the unfinished runs")


def start(r):
    """train.py's argv for r. A second phase starts from a copy of its first phase's checkpoint
    and log, and resets the optimizer (--switch_reset) only while that copy is its checkpoint."""
    ckpt = os.path.join(r['out_dir'], 'ckpt.pt')
    os.makedirs(r['out_dir'], exist_ok=True)
    after = r.get('after')
    if after and not os.path.exists(ckpt):
        for f in ('ckpt.pt', 'log.jsonl'):
            shutil.copy2(os.path.join(after['out_dir'], f), os.path.join(r['out_dir'], f))
    resume = os.path.exists(ckpt)
    reset = r.get('reset') and filecmp.cmp(ckpt, os.path.join(after['out_dir'], 'ckpt.pt'), shallow=False)
    return ([sys.executable, os.path.join(ROOT, 'train.py'), *r['argv']] + (['--init_from=resume'] if resume else [])
            + (['--reset_optimizer=True'] if reset else [])), resume


def launch(todo, running, nproc, env, gpus):
    """Keeps nproc runs going until every run in todo has ended; a second phase waits until its
    first has exited and is dropped (reported as not run) when that one did not finish."""
    slot = 0

    def waits(r):  # its first phase has not exited: it logs its last evaluation before its checkpoint
        return r.get('after') is not None and any(r['after'] is q for q in todo + running)

    while todo or running:
        for r in [r for r in todo if r.get('after') and not waits(r) and not finished(r['after'])]:
            todo.remove(r)
            print(f"{r['name']}: not run, its first phase {r['after']['name']} did not finish")
        ready = [r for r in todo if not waits(r)]
        while ready and len(running) < nproc:
            r = ready.pop(0)
            todo.remove(r)
            argv, resume = start(r)
            run_env = dict(env, CUDA_VISIBLE_DEVICES=str(slot % gpus)) if gpus > 1 else env
            slot += 1
            out = open(os.path.join(r['out_dir'], 'stdout.log'), 'a')
            r['proc'], r['stdout'], r['t0'] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=run_env), out, time.time()
            print(f"{r['name']}: {'resumed' if resume else 'started'}")
            running.append(r)
        time.sleep(0.2)
        for r in [r for r in running if r['proc'].poll() is not None]:
            running.remove(r)
            r['stdout'].close()
            status = {'returncode': r['proc'].returncode, 'wall_s': time.time() - r['t0']}
            with open(os.path.join(r['out_dir'], 'run.json'), 'w') as f:
                json.dump(status, f)
            print(f"{r['name']}: {'done' if finished(r) else 'FAILED'} (exit {status['returncode']}, {status['wall_s']:.0f} s)")


def mean_std(values, fmt):
    if not values:
        return '-'
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(statistics.stdev(values))}"


def run_status(r):
    """(exit status or None when never run, wall seconds or None, the last 3 lines it printed)."""
    try:
        with open(os.path.join(r['out_dir'], 'run.json')) as f:
            status = json.load(f)
    except (OSError, json.JSONDecodeError):  # never run, or run by train.py itself
        status = {}
    try:
        with open(os.path.join(r['out_dir'], 'stdout.log')) as f:
            tail = ' | '.join(line.strip() for line in f.read().splitlines()[-3:])
    except OSError:
        tail = ''
    return status.get('returncode'), status.get('wall_s'), tail


def summarise(runs):
    """{group: {'ok': [per-run numbers], 'failed': [(name, why, tail)], 'unit': ...}} in plan
    order; a second phase's wall time includes its first phase's."""
    groups = {}
    for r in runs:
        if r['group'] is None:
            continue
        g = groups.setdefault(r['group'], {'ok': [], 'failed': [], 'unit': None})
        log = logs.read(r['out_dir'])
        evals = [x for x in log if 'val_loss' in x]
        code, wall, tail = run_status(r)
        if not finished(r):
            after = r.get('after')
            if code is None and after and not finished(after):
                code, _, tail = run_status(after)
                why = f"its first phase {after['name']} did not finish" + ('' if code is None else f", exit {code}")
            else:
                why = 'not run' if code is None else f"exit {code}" + (', stopped before max_iters' if code == 0 else '')
            g['failed'].append((r['name'], why, tail))
            continue
        if r.get('after') and wall is not None:
            first_wall = run_status(r['after'])[1]
            wall = None if first_wall is None else wall + first_wall
        unit = next((k[:-len('_per_s')] for x in log for k in x if k.endswith('_per_s')), None)
        g['unit'] = unit
        rates = [x[f'{unit}_per_s'] for x in log if f'{unit}_per_s' in x]
        g['ok'].append(dict(
            seed=r['seed'], best=min(x['val_loss'] for x in evals), final=evals[-1]['val_loss'],
            top1=evals[-1].get('top1'), top5=evals[-1].get('top5'),
            rate=statistics.median_high(rates) if rates else None, wall=wall,
            curve=logs.evaluations(log)))
    return groups


def reached(groups, label):
    """(target, {group: [per seed, the first evaluated iteration whose val loss is at most target,
    or None]}), target being the mean final val loss of group `label`."""
    try:
        target = float(label)
    except ValueError:
        if not groups.get(label, {}).get('ok'):
            raise UserError(f"--reach {label!r} names no finished group; the groups: {', '.join(groups)}")
        target = statistics.mean(r['final'] for r in groups[label]['ok'])
    return target, {name: [next((it for it, loss, _ in r['curve'] if loss <= target), None) for r in g['ok']]
                    for name, g in groups.items()}


def table(groups, reach=None):
    """The results table; with reach (a group's label) a column of when each seed first reached
    that group's mean final val loss."""
    images = any(r['top1'] is not None for g in groups.values() for r in g['ok'])
    target, when = reached(groups, reach) if reach else (None, {})
    head = ['run', 'seeds', 'best val loss', 'final val loss'] + (['top-1 %', 'top-5 %'] if images else []) + \
        ([f"reaches {target:.4f} at (per seed)"] if reach else []) + ['throughput (median)', 'wall time (mean)']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    notes = []
    for label, g in groups.items():
        ok = g['ok']
        cells = [f"`{label}`", f"{len(ok)}/{len(ok) + len(g['failed'])}",
                 mean_std([r['best'] for r in ok], '{:.4f}'), mean_std([r['final'] for r in ok], '{:.4f}')]
        if images:
            cells += [mean_std([r['top1'] for r in ok if r['top1'] is not None], '{:.2f}'),
                      mean_std([r['top5'] for r in ok if r['top5'] is not None], '{:.2f}')]
        if reach:
            cells.append(', '.join('not reached' if it is None else str(it) for it in when[label]) or '-')
        rates = [r['rate'] for r in ok if r['rate'] is not None]
        cells += [f"{statistics.median_high(rates):,.0f} {g['unit']}/s" if rates else '-',
                  f"{statistics.mean(walls):.0f} s" if (walls := [r['wall'] for r in ok if r['wall'] is not None]) else '-']
        lines.append('| ' + ' | '.join(cells) + ' |')
        notes += [f"- `{name}` failed ({why}): {tail}" for name, why, tail in g['failed']]
    return '\n'.join(lines + ([''] + notes if notes else [])) + '\n'


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('configs', nargs='+', help='config files, one group each')
    p.add_argument('--stack', action='append', default=[], help='config file stacked after each config (e.g. config/cpu.py)')
    p.add_argument('--seeds', type=int, default=3)
    p.add_argument('--set', action='append', default=[], metavar='KEY=V1,V2', help='one group per value')
    p.add_argument('--switch', action='append', default=[], metavar='KEY=V1,V2',
                   help='continue each run at --switch_at with each value (one group per value)')
    p.add_argument('--switch_at', type=int, help='iteration of the switch')
    p.add_argument('--switch_reset', action='store_true', help='first phase a complete run; fresh AdamW and schedule after the switch')
    p.add_argument('--nproc', type=int, default=1, help='runs at once')
    p.add_argument('--per', action='append', default=[], metavar='CONFIG:KEY=VALUE',
                   help="a setting for one config's runs only (e.g. each config at its own learning_rate)")
    p.add_argument('--reach', default=None, metavar='GROUP',
                   help="add a column: when each run first reached GROUP's mean final val loss (a row's label), "
                        "or a val loss given as a number")
    p.add_argument('--out', default='out-compare', help='folder for the runs, results.md and curves.png')
    args, extra = p.parse_known_args(argv)
    bad = [a for a in extra if not a.startswith('--') or '=' not in a]
    if bad:
        raise UserError(f"unexpected arguments {bad}; config keys go as --key=value")
    if not 1 <= args.seeds <= len(SEEDS) or args.nproc < 1:
        raise UserError(f"--seeds must lie in [1, {len(SEEDS)}] and --nproc be at least 1")
    if bool(args.switch) != (args.switch_at is not None) or (args.switch_reset and not args.switch):
        raise UserError("--switch KEY=V1,V2 and --switch_at=ITER go together (--switch_reset with them)")
    return args, extra


@errors.entry
def main(argv=None):
    args, extra = parse_args(argv)
    runs = plan(args, extra)
    os.makedirs(args.out, exist_ok=True)
    execute(runs, args.nproc)
    groups = summarise(runs)
    command = 'python tools/compare.py ' + shlex.join(sys.argv[1:] if argv is None else argv)
    protocol = '' if not args.switch else (
        f"Second phases continue their first phase's checkpoint from iteration {args.switch_at} "
        + ("with a fresh AdamW and learning-rate schedule.\n\n" if args.switch_reset
           else "with its AdamW state and learning-rate schedule.\n\n"))
    reach = '' if not args.reach else (
        f"The reach column: the first evaluation at which each seed's val loss is at most "
        f"{reached(groups, args.reach)[0]:.4f} (`{args.reach}`).\n\n")
    text = f"`{command}`\n\n" + protocol + reach + table(groups, args.reach)
    with open(os.path.join(args.out, 'results.md'), 'w') as f:
        f.write(text)
    print(text)
    plots.curves({label: [r['curve'] for r in g['ok']] for label, g in groups.items()},
                 os.path.join(args.out, 'curves.png'), args.switch_at)
    return groups


if __name__ == '__main__':
    main()
