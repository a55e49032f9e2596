"""Run configs x seeds x settings with train.py and compare them in tables and one figure.

    python tools/compare.py config/shakespeare_add.py config/shakespeare_rot.py --stack=config/cpu.py \\
        --seeds=3 --set sigma_w=0.25,0.5,1.0 --out=compare-sigma
    python tools/compare.py config/shakespeare_{add,ngpt}.py --stack=config/cpu.py --nproc=2 \\
        --tune learning_rate=1e-3,2e-3,4e-3 --seeds=3 --lengths=500,1000,2000 --baseline=shakespeare_add

Every run is `python train.py CONFIG [STACK ...] [--key=value ...] --seed=S --out_dir=OUT/NAME` in
its own process and folder; extra --key=value arguments go to every run, --set key=v1,v2 makes
one group per value (several --set: every combination), --per CONFIG:key=value sets a key for
one config's runs. A run is finished when its log holds the evaluation at max_iters: finished
runs are not rerun (one of another config stops the comparison, naming the keys that differ),
interrupted ones resume from their checkpoint, failed ones start again.
--nproc runs that many at once (CPU threads are split between them; with several GPUs each run
gets one, in turn). Ctrl-C or SIGTERM stops the runs at their next step with a checkpoint, and so
does the end of compare.py by SIGKILL (on Linux). A second compare.py on the same --out is refused
while the first runs, and each run's train.py holds its own folder.

Seeds, tuning and reporting apart: --tune key=v1,v2 (several: every combination) runs each
config x setting once per value on the tuning seed, 1337 (train.py's default), takes the value of
the lowest final val loss and reports --seeds other seeds, 1, 2, 3, ..., with it. A numeric grid
of constant ratio whose best value lies on its edge is extended by that ratio, up to twice on
each side. Without --tune the reported seeds are the same 1, 2, 3, ...

Paired differences: the same seed gives every config the same batches (and the same initial
weights where two architectures agree), so the runs pair. The Δ column is each row's final val
loss minus that of --baseline (a config's name, the first config by default) at the same --set
values, length, switch value and seeds, or at the --set values it names ('CONFIG k=v') and the
row's own values of the others: their mean ± its standard error (std / sqrt(n)), over the seeds
both finished.

The speedup protocol of nGPT (I. Loshchilov et al., arXiv:2410.01131, Sec. 3.1): --lengths=L1,L2,..
runs complete runs of each length, each with its own full schedule (the cosine ends at its
max_iters; a --tune value is tuned at the configs' own max_iters), and for each config finds the
length at which its mean final val loss equals --baseline's at the longest length: interpolated
in log(length) between the two lengths around it, and the speedup is the longest length over it. With --nproc=1 the table gives it in time too
(the runs' median ms/iter times the steps); runs that shared the machine time nothing.

Switching mid-training (G. Oh et al., "Revisiting Residual Connections: Orthogonal Updates for
Stable and Efficient Deep Networks", NeurIPS 2025, arXiv:2505.11881, Sec. 4.3 and App. C.3: L->O
and O->L):
    python tools/compare.py config/vit_fashion_add.py config/vit_fashion_ortho.py --seeds=3 \\
        --switch residual=additive,orthogonal --switch_at=1300 [--switch_reset]
trains each config x setting x seed once up to --switch_at (folder NAME-first<ITER>-sS), then
continues a copy of that run to max_iters once per --switch value (one group per value, so the
example gives L->L, L->O, O->L and O->O from two first phases). Without --switch_reset the first
phase keeps the full run's learning-rate schedule and the second continues it with the same
optimizer state (App. C.3); with it the first phase is a complete run of --switch_at iterations
(its schedule decays there) and the second restarts the optimizer and the schedule, warmup
included (Sec. 4.3).

Writes OUT/results.md: the tuning table (with --tune); a row per config x setting (x switch
value, x length) with its parameter count, mean +- sample std over its finished seeds of the best
and the final validation loss (and the final top-1 / top-5 for images), the paired difference,
and with --nproc=1 the median tokens/s (or images/s) of the training log lines and the mean wall
time of the runs; the speedup table (with --lengths). A run that failed or did not finish is named
under its table with its exit status and the last lines it printed. OUT/curves.png: validation loss
(and top-1 for images) against iteration, mean over seeds, a line per row (a dashed line at
--switch_at).
"""

import argparse
import filecmp
import itertools
import json
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: train.py
sys.path.insert(0, ROOT)
import configure  # noqa: E402
from orthogpt import errors, lock, logs, plots, resume, signals  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402

TUNING_SEED = 1337
SEEDS = list(range(1, 100))  # the reported ones


def parse_set(text):
    key, sep, values = text.partition('=')
    if not sep or not values:
        raise UserError(f"--set {text!r}: write --set key=v1,v2,...")
    return [(key, v) for v in values.split(',')]


def parse_per(text):
    """--per 'CONFIG[ key=value ...]:KEY=VALUE', a setting for the runs of one config (and, where
    given, of its --set values) alone: (config stem, {key: value} it selects, (key, value))."""
    selector, colon, kv = text.partition(':')
    key, eq, value = kv.partition('=')
    stem, *picks = selector.split() or ['']
    if not stem or not colon or not eq or not key or not value or not all('=' in p for p in picks):
        raise UserError(f"--per {text!r}: write --per CONFIG:key=value or --per 'CONFIG k=v:key=value' (CONFIG: a "
                        f"config file's name, k=v: a --set value)")
    return os.path.splitext(os.path.basename(stem))[0], dict(p.split('=', 1) for p in picks), (key, value)


def load(argv, name):
    try:
        return configure.load(argv)
    except UserError as e:
        raise UserError(f"{e} (run {name})") from None


def label_of(name, setting):
    return name + ''.join(f" {k}={v}" for k, v in setting)


def cases(args):
    """Every config x --set combination: {'config', 'name' (the config's file name), 'set' (its --set
    values), 'setting' (its --per settings, then the --set values), 'case' (the row's label)}."""
    settings = list(itertools.product(*[parse_set(s) for s in args.set])) or [()]
    per = [parse_per(p) for p in args.per]
    names = {os.path.splitext(os.path.basename(c))[0] for c in args.configs}
    for text, (stem, picks, _) in zip(args.per, per):
        if stem not in names or not any(picks.items() <= dict(values).items() for values in settings):
            raise UserError(f"--per {text!r} selects no run: the configs are {', '.join(sorted(names))}"
                            + (f", the --set values {', '.join(s for s in args.set)}" if args.set else ''))
    found = []
    for config in args.configs:
        name = os.path.splitext(os.path.basename(config))[0]
        for values in settings:
            setting = (*(kv for stem, picks, kv in per if stem == name and picks.items() <= dict(values).items()),
                       *values)
            found.append(dict(config=config, name=name, set=values, setting=setting, case=label_of(name, setting)))
    return found


def plan(args, extra, cases, seeds, lengths=(None,)):
    """One dict per run of each case x length x seed: its group (the row it counts in; None for a
    first phase), case, length, setting, seed, name, argv, out_dir and, for a second phase, the
    first phase it continues (`after`); each argv checked with configure.load first, so a typo
    stops the comparison before any run starts."""
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

    for c in cases:
        for length in lengths:
            setting = (*c['setting'], *((('max_iters', length),) if length else ()))
            label = label_of(c['name'], setting)
            stem = label.replace(' ', '-').replace('=', '')
            argv = [c['config'], *args.stack, *extra, *(f'--{k}={v}' for k, v in setting)]
            own = dict(case=c['case'], length=length, setting=c['setting'], config_name=c['name'], set=c['set'])
            for seed in seeds:
                if not switches:
                    add(label, seed, f'{stem}-s{seed}', argv, **own)
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
                              after=first, reset=args.switch_reset, switch=tuple(switch), **own)
                    problems = resume.problems(first['cfg'], run['cfg'])
                    if problems:
                        raise UserError(f"--switch: {run['name']} cannot continue {first['name']}: "
                                        + '; '.join(problems))
    return runs


def finished(run):
    return any(r['iter'] == run['cfg'].max_iters and 'val_loss' in r for r in logs.read(run['out_dir']))


def final_loss(run):
    """A finished run's final val loss; inf for one that failed (diverged, say)."""
    evals = logs.evaluations(logs.read(run['out_dir']))
    return evals[-1][1] if finished(run) and math.isfinite(evals[-1][1]) else math.inf


def tune(args, extra):
    """(the cases, each with the --tune setting of the lowest final val loss on the tuning seed
    appended, and the tuning runs); a geometric grid whose best value lies on its edge is extended
    (twice at most on a side)."""
    keys = [t.partition('=')[0] for t in args.tune]
    grids = {c['case']: {k: [v for _, v in parse_set(t)] for k, t in zip(keys, args.tune)} for c in cases(args)}
    added = {}
    while True:
        todo = [dict(c, setting=(*c['setting'], *zip(grid, combo)), case=c['case'])
                for c in cases(args) for grid in [grids[c['case']]] for combo in itertools.product(*grid.values())]
        runs = plan(args, extra, todo, [TUNING_SEED])
        execute(runs, args.nproc)
        best = {}
        for r in sorted(runs, key=final_loss):
            best.setdefault(r['case'], dict(r['setting'][-len(keys):]))
        wider = {case: {k: extend(vs, best[case][k], added, (case, k)) for k, vs in grid.items()}
                 for case, grid in grids.items()}
        if wider == grids:
            return [dict(c, setting=(*c['setting'], *best[c['case']].items()),
                         case=label_of(c['case'], best[c['case']].items())) for c in cases(args)], runs
        grids = wider


def extend(values, best, added, key, most=2):
    """values with one more beyond `best` where best is the smallest or the largest of a numeric
    grid of constant ratio, at most `most` times per side (counted in added)."""
    try:
        numbers = sorted(float(v) for v in values)
    except ValueError:
        return values
    if len(numbers) < 2 or numbers[0] <= 0 or float(best) not in (numbers[0], numbers[-1]):
        return values
    ratio = numbers[1] / numbers[0]
    if not all(math.isclose(b / a, ratio, rel_tol=1e-6) for a, b in zip(numbers, numbers[1:])):
        return values
    side = 'low' if float(best) == numbers[0] else 'high'
    new = numbers[0] / ratio if side == 'low' else numbers[-1] * ratio
    integers = all(v.strip().lstrip('+-').isdigit() for v in values)
    if added.get((key, side), 0) >= most or (integers and not math.isclose(new, round(new))):
        return values
    added[(key, side)] = added.get((key, side), 0) + 1
    return [*values, str(round(new)) if integers else f"{new:.12g}"]


def execute(runs, nproc):
    """Run the unfinished runs, nproc at a time; records each one's exit status and wall time."""
    todo = [r for r in runs if not finished(r)]
    for r in runs:
        if r not in todo:
            other = trained_otherwise(r)
            if other:
                raise UserError(f"{r['out_dir']} holds a run of another config ("
                                + ', '.join(f"{k}: {ours!r} here, {theirs!r} there" for k, (ours, theirs) in other.items())
                                + "); give this comparison another --out, or remove that folder to run it again")
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
            # if compare.py dies (SIGKILL included), its runs get SIGTERM: they save and stop
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=run_env,
                                    preexec_fn=signals.stop_with_parent)
            r['proc'], r['stdout'], r['t0'] = proc, out, time.time()
            print(f"{r['name']}: {'resumed' if resume else 'started'}")
            running.append(r)
        time.sleep(0.2)
        for r in [r for r in running if r['proc'].poll() is not None]:
            running.remove(r)
            r['stdout'].close()
            status = {'returncode': r['proc'].returncode, 'wall_s': time.time() - r['t0'], 'argv': r['argv']}
            with open(os.path.join(r['out_dir'], 'run.json'), 'w') as f:
                json.dump(status, f)
            print(f"{r['name']}: {'done' if finished(r) else 'FAILED'} (exit {status['returncode']}, {status['wall_s']:.0f} s)")


def mean_std(values, fmt):
    if not values:
        return '-'
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(statistics.stdev(values))}"


def trained_otherwise(r):
    """{key: (r's value, the value of the run in r's folder)} where the two configs differ, but for
    out_dir: a folder may hold a run that another comparison trained with the same config (a link)."""
    before = run_status(r)[3]
    if before is None:  # never run by compare.py
        return {}
    ours, theirs = asdict(r['cfg']), asdict(load(before, r['name']))
    return {k: (ours[k], theirs[k]) for k in ours if k != 'out_dir' and ours[k] != theirs[k]}


def run_status(r):
    """(exit status or None when never run, wall seconds or None, the last 3 lines it printed, the
    train.py arguments it ran with or None)."""
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
    return status.get('returncode'), status.get('wall_s'), tail, status.get('argv')


def summarise(runs):
    """{group: {'ok': [per-run numbers], 'failed': [(name, why, tail)], 'unit', 'case', 'length',
    'params'}} in plan order; a second phase's wall time includes its first phase's."""
    groups = {}
    for r in runs:
        if r['group'] is None:
            continue
        g = groups.setdefault(r['group'], {'ok': [], 'failed': [], 'unit': None, 'case': r['case'],
                                           'name': r['config_name'], 'set': r['set'], 'length': r['length'],
                                           'switch': r.get('switch', ()), 'params': None})
        log = logs.read(r['out_dir'])
        g['params'] = g['params'] or next((x['parameters'] for x in log if x.get('event') == 'start'), None)
        evals = [x for x in log if 'val_loss' in x]
        code, wall, tail, _ = run_status(r)
        if not finished(r):
            after = r.get('after')
            if code is None and after and not finished(after):
                code, _, tail, _ = run_status(after)
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
        steps = [x['ms_per_iter'] for x in log if 'ms_per_iter' in x]
        g['ok'].append(dict(
            seed=r['seed'], best=min(x['val_loss'] for x in evals), final=evals[-1]['val_loss'],
            top1=evals[-1].get('top1'), top5=evals[-1].get('top5'), wall=wall,
            rate=statistics.median_high(rates) if rates else None,
            ms=statistics.median_high(steps) if steps else None, curve=logs.evaluations(log)))
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


def paired(g, base):
    """(mean, standard error, n) of g's final val loss minus base's over the seeds both finished."""
    mine, theirs = ({r['seed']: r['final'] for r in x['ok']} for x in (g, base))
    diffs = [mine[s] - theirs[s] for s in mine if s in theirs]
    if not diffs:
        return None
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return statistics.mean(diffs), se, len(diffs)


def baseline_of(groups, selector):
    """(the baseline's label, {group: the baseline's group at the same length and switch value}).
    selector: a config's file name, compared at each row's own --set values (the first config's
    by default), or 'CONFIG k=v ...', that config at the --set values it names and at each row's
    own values of the others."""
    name, *picks = (selector or next(iter(groups.values()))['name']).split()
    if not all('=' in p for p in picks):
        raise UserError(f"--baseline {selector!r}: write CONFIG or 'CONFIG key=value ...' (a --set value)")
    picks = dict(p.split('=', 1) for p in picks)

    def key(g):
        return tuple((k, v) for k, v in g['set'] if k not in picks), g['length'], g['switch']
    at = {key(g): label for label, g in groups.items() if g['name'] == name and picks.items() <= dict(g['set']).items()}
    if not at:
        raise UserError(f"--baseline {selector!r} names no row; the configs: "
                        f"{', '.join(dict.fromkeys(g['name'] for g in groups.values()))}")
    return ' '.join([name, *(f'{k}={v}' for k, v in picks.items())]), {label: at.get(key(g)) for label, g in groups.items()}


def table(groups, baseline=None, reach=None, timed=True):
    """The results table: parameters, best and final val loss, the paired difference of the final
    one against the baseline; with reach (a group's label) a column of when each seed first reached
    that group's mean final val loss; timed: the runs' throughput and wall time."""
    images = any(r['top1'] is not None for g in groups.values() for r in g['ok'])
    target, when = reached(groups, reach) if reach else (None, {})
    base, against = baseline_of(groups, baseline)
    head = ['run', 'parameters', 'seeds', 'best val loss', 'final val loss'] + \
        (['top-1 %', 'top-5 %'] if images else []) + [f"Δ final vs `{base}` (paired, ± s.e.)"] + \
        ([f"reaches {target:.4f} at (per seed)"] if reach else []) + \
        (['throughput (median)', 'wall time (mean)'] if timed else [])
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    notes = []
    for label, g in groups.items():
        ok = g['ok']
        cells = [f"`{label}`", f"{g['params']:,}" if g['params'] else '-', f"{len(ok)}/{len(ok) + len(g['failed'])}",
                 mean_std([r['best'] for r in ok], '{:.4f}'), mean_std([r['final'] for r in ok], '{:.4f}')]
        if images:
            cells += [mean_std([r['top1'] for r in ok if r['top1'] is not None], '{:.2f}'),
                      mean_std([r['top5'] for r in ok if r['top5'] is not None], '{:.2f}')]
        diff = paired(g, groups[against[label]]) if against[label] and against[label] != label else None
        cells.append('-' if diff is None else f"{diff[0]:+.4f} ± {diff[1]:.4f} (n={diff[2]})" if diff[2] > 1 else
                     f"{diff[0]:+.4f} (n=1)")
        if reach:
            cells.append(', '.join('not reached' if it is None else str(it) for it in when[label]) or '-')
        if timed:
            rates, walls = [r['rate'] for r in ok if r['rate']], [r['wall'] for r in ok if r['wall'] is not None]
            cells += [f"{statistics.median_high(rates):,.0f} {g['unit']}/s" if rates else '-',
                      f"{statistics.mean(walls):.0f} s" if walls else '-']
        lines.append('| ' + ' | '.join(cells) + ' |')
        notes += [f"- `{name}` failed ({why}): {tail}" for name, why, tail in g['failed']]
    return '\n'.join(lines + ([''] + notes if notes else [])) + '\n'


def tuning_table(runs, chosen):
    """Each tuning run's final val loss, the chosen setting of each case in bold."""
    lines = ['| tuning run (seed 1337) | final val loss |', '|---|---|']
    picked = {label_of(c['name'], c['setting']) for c in chosen}
    for r in runs:
        loss = final_loss(r)
        label = r['group']
        cell = f"{loss:.4f}" if math.isfinite(loss) else 'failed or not finite'
        lines.append(f"| `{label}` | {'**' + cell + '**' if label in picked else cell} |")
    return '\n'.join(lines) + '\n'


def crossing(points, target):
    """The length at which the curve through points [(length, mean final loss)] first comes down
    to target, linear in log(length) between two lengths; (value, how) with how '<=' where the
    shortest already reaches it, '>' where the longest does not."""
    points = sorted(points)
    if points[0][1] <= target:
        return points[0][0], '<='
    for (l0, y0), (l1, y1) in zip(points, points[1:]):
        if y1 <= target:
            return math.exp(math.log(l0) + (y0 - target) / (y0 - y1) * (math.log(l1) - math.log(l0))), '='
    return points[-1][0], '>'


def speedup_table(groups, baseline, timed):
    """The nGPT paper's protocol (module docstring): the steps (and time) at which each case's mean
    final val loss reaches the baseline's (baseline_of) at the longest length."""
    name, against = baseline_of(groups, baseline)
    by_case = {}
    for label, g in groups.items():
        by_case.setdefault(g['case'], {})[g['length']] = label
    lengths = sorted({n for runs in by_case.values() for n in runs})
    longest = lengths[-1]
    head = ['method', 'parameters'] + [f"final val loss, {n} steps" for n in lengths] + \
        ['baseline at {longest}'.format(longest=longest), 'steps to it', 'speedup in steps'] + \
        (['ms/iter', 'time to it', 'speedup in time'] if timed else [])
    whose = " (at the row's --set values)" if ' ' not in name and any(g['set'] for g in groups.values()) else ''
    lines = [f"Target of each row: the final val loss of `{name}`{whose} at {longest} steps, mean over seeds.", '',
             '| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]

    def ms_of(labels):
        ms = [r['ms'] for label in labels for r in groups[label]['ok'] if r['ms']]
        return statistics.median(ms) if ms else None
    for case, runs in by_case.items():
        base = against[runs[longest]] if longest in runs else None
        points = [(n, statistics.mean(r['final'] for r in groups[label]['ok'])) for n, label in runs.items()
                  if groups[label]['ok']]
        if base is None or not groups[base]['ok'] or not points:
            continue
        target = statistics.mean(r['final'] for r in groups[base]['ok'])
        steps, how = crossing(points, target)
        params = groups[next(iter(runs.values()))]['params']
        cells = [f"`{case}`", f"{params:,}" if params else '-'] + \
            [mean_std([r['final'] for r in groups[runs[n]]['ok']], '{:.4f}') if n in runs else '-' for n in lengths]
        shown = {'<=': f"≤ {steps:.0f}", '=': f"{steps:.0f}", '>': f"> {steps:.0f} (not reached)"}[how]
        cells += [f"{target:.4f}", shown, f"{longest / steps:.2f}x" if how == '=' else '-']
        if timed:
            ms, base_ms = ms_of(runs.values()), ms_of([against[label] for label in runs.values() if against[label]])
            known = how == '=' and ms and base_ms
            cells += [f"{ms:.1f}" if ms else '-', f"{steps * ms / 1e3:.0f} s" if known else '-',
                      f"{longest * base_ms / (steps * ms):.2f}x" if known else '-']
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('configs', nargs='+', help='config files, one group each')
    p.add_argument('--stack', action='append', default=[], help='config file stacked after each config (e.g. config/cpu.py)')
    p.add_argument('--seeds', type=int, default=3, help='reported seeds: 1, 2, ..., N')
    p.add_argument('--set', action='append', default=[], metavar='KEY=V1,V2', help='one group per value')
    p.add_argument('--tune', action='append', default=[], metavar='KEY=V1,V2',
                   help='try each value on the tuning seed (1337) and report the best one on --seeds others')
    p.add_argument('--lengths', default=None, metavar='L1,L2,...',
                   help="complete runs of these max_iters each (nGPT's speedup protocol; the table needs two or more)")
    p.add_argument('--baseline', default=None, metavar='CONFIG',
                   help="the config (file name) the paired differences and the speedup compare with, at each "
                        "row's --set values (default: the first config); 'CONFIG k=v' fixes its --set values")
    p.add_argument('--switch', action='append', default=[], metavar='KEY=V1,V2',
                   help='continue each run at --switch_at with each value (one group per value)')
    p.add_argument('--switch_at', type=int, help='iteration of the switch')
    p.add_argument('--switch_reset', action='store_true', help='first phase a complete run; fresh optimizer and schedule after the switch')
    p.add_argument('--nproc', type=int, default=1, help='runs at once (above 1, nothing is timed)')
    p.add_argument('--per', action='append', default=[], metavar='CONFIG:KEY=VALUE',
                   help="a setting for one config's runs only (e.g. each config at its own learning_rate); "
                        "'CONFIG k=v:KEY=VALUE' for those of its --set value k=v only")
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
    try:
        args.lengths = sorted(int(n) for n in args.lengths.split(',')) if args.lengths else None
    except ValueError:
        raise UserError(f"--lengths={args.lengths}: write iteration counts, e.g. --lengths=500,1000,2000") from None
    if args.switch and (args.lengths or args.tune):
        raise UserError("--switch goes with neither --lengths nor --tune: tune the first phase's setting first, "
                        "then compare the switches at it")
    return args, extra


@errors.entry
def main(argv=None):
    args, extra = parse_args(argv)
    with lock.hold(args.out):  # one comparison per folder; each run's train.py locks its own
        return compare(args, extra, argv)


def compare(args, extra, argv):
    """main()'s comparison, its --out held: the runs, results.md and curves.png; the groups."""
    chosen, tuning = tune(args, extra) if args.tune else (cases(args), [])
    runs = plan(args, extra, chosen, SEEDS[:args.seeds], args.lengths or (None,))
    execute(runs, args.nproc)
    groups = summarise(runs)
    command = 'python tools/compare.py ' + shlex.join(sys.argv[1:] if argv is None else argv)
    timed = args.nproc == 1
    protocol = '' if not args.switch else (
        f"Second phases continue their first phase's checkpoint from iteration {args.switch_at} "
        + ("with a fresh optimizer and learning-rate schedule.\n\n" if args.switch_reset
           else "with its optimizer state and learning-rate schedule.\n\n"))
    reach = '' if not args.reach else (
        f"The reach column: the first evaluation at which each seed's val loss is at most "
        f"{reached(groups, args.reach)[0]:.4f} (`{args.reach}`).\n\n")
    untimed = '' if timed else f"The {args.nproc} runs at a time shared the machine: nothing is timed.\n\n"
    text = (f"`{command}`\n\n" + (tuning_table(tuning, chosen) + '\n' if tuning else '') + protocol + reach + untimed
            + table(groups, args.baseline, args.reach, timed)
            + ('\n' + speedup_table(groups, args.baseline, timed) if args.lengths and len(args.lengths) > 1 else ''))
    with open(os.path.join(args.out, 'results.md'), 'w') as f:
        f.write(text)
    print(text)
    plots.curves({label: [r['curve'] for r in g['ok']] for label, g in groups.items()},
                 os.path.join(args.out, 'curves.png'), args.switch_at)
    return groups


if __name__ == '__main__':
    main()
