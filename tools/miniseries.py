"""A scaling miniseries: each residual rule (a config file) at several sizes (--depths) x seeds,
its final loss fitted against training compute, and each rule's compute multiplier over a baseline.

    # a CPU, Tiny Shakespeare (characters): 9 rules x 4 sizes x 2 seeds, each at the CPU recipe's rate tuned
    # for it (docs/results.md)
    python tools/miniseries.py config/shakespeare_{add,ortho,rot,ngpt,hc,mhc,ddl,attnres,denseformer}.py --stack=config/cpu.py \\
        --depths=2,3,4,5 --seeds=2 --out=out-miniseries
    # a GPU, GPT-2 BPE: FineWeb-edu's shards (python data/prepare_text.py --dataset fineweb-edu, into
    # data/fineweb-edu/; or openwebtext), the same rules with 1024-token windows; tools/suite.py's miniseries
    # stage runs it with one seed
    python tools/miniseries.py config/shakespeare_{add,ortho,rot,ngpt,hc,mhc,ddl,attnres,denseformer}.py --dataset=fineweb-edu \\
        --depths=2,3,4,5 --seeds=2 --block_size=1024 --batch_size=16 --eval_interval=500 --eval_iters=20 \\
        --nproc=4 --out=out-miniseries-fineweb

The runs: one `python tools/compare.py CONFIGS [--stack=...] --set depth=D1,D2,.. --seeds=N --out=OUT
--baseline=BASE --nproc=N [--per ...] [--key=value ...]` in a process of its own, so a run is
`python train.py CONFIG [STACK] [--key=value ...] --depth=D --seed=S` in its own folder under OUT.
The depth comes after the other keys, and its rule (python train.py --help) sets n_layer = n_head =
D, n_embd = aspect x D and, with tokens_per_param > 0, max_iters from a budget of tokens_per_param
tokens per parameter of the blocks; it scales the learning_rate set before it to the width. So
--aspect sets the width per layer, --tokens_per_param the budget, and --max_iters goes with
--tokens_per_param=0.

compare.py keeps finished runs, resumes interrupted ones from their checkpoints and writes
OUT/results.md (the paired differences at each depth) and OUT/curves.png: the same command after an
interruption (Ctrl-C, SIGTERM) finishes the series without rerunning what finished. While it runs,
a line (whenever a run finishes, and every 30 s) tells how many runs have finished, the iteration of
each running one, and about how long the rest will take: the FLOPs left at the speed of the last two
minutes (those of a size not started yet extrapolated from the sizes started, as a power of the
depth).

Then, from each run's folder alone (found by its name, which starts with its config's file name as
compare.py names it; config.json: its depth and seed; log.jsonl: its parameters, FLOPs per token,
tokens per iteration, final val loss, val_bpb and training seconds), it fits
L(C) = E + A·C^(−α) per rule over its runs' (compute, final val loss) points, with C the training
FLOPs (FLOPs per token x tokens per iteration x iterations), by least squares; the uncertainties
are the fit's covariance, s² (JᵀJ)⁻¹, propagated by the delta method (orthogpt/scaling.py). The
compute multiplier of a rule over --baseline (default: the first config) at a size is the compute
at which the baseline's fit reaches the rule's mean final loss there, over the rule's compute; the
fitted one puts the rule's fitted loss in its place. A loss below the baseline's asymptote E has
none. It writes OUT/miniseries.md (a row per rule and size, then the fits), OUT/miniseries.json
(the same numbers) and OUT/miniseries.png (loss against FLOPs and against wall time, log-log, the
fits dashed). A fit needs three sizes or more (--depths); its uncertainty, two seeds or a fourth size.

Extra --key=value arguments go to every run; --per CONFIG:key=value to one config's runs (its
learning rate, say; 'CONFIG depth=D:key=value' to one size of it). --nproc runs that many at once;
their wall times then share the machine.
"""

import argparse
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: tools/compare.py
sys.path.insert(0, ROOT)
from orthogpt import errors, files, logs, plots, progress, scaling, signals  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402
from orthogpt.estimate import duration  # noqa: E402

POLL = 2.0  # seconds between looks at the run folders
COMPARES = ('set', 'tune', 'lengths', 'switch', 'switch_at', 'switch_reset', 'reach')  # compare.py's, not the series'
OWN = {'depth': 'the sizes go as --depths=D1,D2,...', 'seed': 'the seeds are 1..--seeds',
       'out_dir': 'the runs go under --out', **dict.fromkeys(
           ('n_layer', 'n_head', 'n_embd'), 'depth sets n_layer = n_head = depth and n_embd = aspect x depth; '
                                            'give the width per layer with --aspect')}


def stem(path):
    return os.path.splitext(os.path.basename(path))[0]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)  # --depth=3 is a config key, not --depths
    p.add_argument('configs', nargs='+', help='config files, one residual rule each')
    p.add_argument('--depths', default=None, metavar='D1,D2,...', help='the sizes: train.py --depth values (3 or more)')
    p.add_argument('--seeds', type=int, default=2, help='seeds 1, 2, ..., N per rule and size (default 2)')
    p.add_argument('--stack', action='append', default=[], help='config file stacked after each config (config/cpu.py)')
    p.add_argument('--baseline', default=None, metavar='CONFIG',
                   help="the config (file name) the compute multipliers compare with (default: the first config)")
    p.add_argument('--per', action='append', default=[], metavar='CONFIG:KEY=VALUE',
                   help="a setting for one config's runs (compare.py's --per), e.g. its tuned learning rate")
    p.add_argument('--nproc', type=int, default=1, help='runs at once (compare.py --nproc)')
    p.add_argument('--out', default='out-miniseries', help='folder for the runs, miniseries.md/.json/.png')
    args, extra = p.parse_known_args(argv)
    check(args, extra)
    return args, extra


def check(args, extra):
    """UserError for input the series cannot run with, naming the fix."""
    for c in args.configs:
        if not os.path.isfile(c):
            raise UserError(f"config file {c!r} not found; the configs live in config/, e.g. config/shakespeare_add.py")
    names = [stem(c) for c in args.configs]
    if len(set(names)) < len(names):
        raise UserError(f"two configs share a file name ({', '.join(names)}): the runs' folders and the table name "
                        "each config by its file name")
    try:
        depths = [int(d) for d in (args.depths or '').split(',')]
    except ValueError:
        depths = []
    if not depths or min(depths) < 1 or len(set(depths)) < 3:
        raise UserError(f"--depths={args.depths}: give 3 or more distinct whole sizes, e.g. --depths=2,3,4,5 "
                        "(a fit of E, A and α needs three)")
    args.depths = sorted(set(depths))
    if args.seeds < 1 or args.nproc < 1:
        raise UserError("--seeds and --nproc take a whole number of 1 or more")
    args.baseline = stem(args.baseline) if args.baseline else names[0]
    if args.baseline not in names:
        raise UserError(f"--baseline={args.baseline} is none of the configs ({', '.join(names)})")
    keys = [a[2:].partition('=')[0] for a in extra]
    for a, key in zip(extra, keys):
        if key in COMPARES:
            raise UserError(f"--{key} is tools/compare.py's, not the miniseries': tune or compare with compare.py, then "
                            "give each config its value with --per CONFIG:key=value")
        if not a.startswith('--') or '=' not in a:
            raise UserError(f"unexpected argument {a!r}; config keys go as --key=value")
        if key in OWN:
            raise UserError(f"--{key}: {OWN[key]}")
    if 'max_iters' in keys and 'tokens_per_param' not in keys:
        raise UserError("--max_iters goes with --tokens_per_param=0: else depth sets max_iters from the token budget "
                        "(tokens_per_param x the blocks' parameters)")


def compare_argv(args, extra):
    return [sys.executable, os.path.join(ROOT, 'tools', 'compare.py'), *args.configs,
            *(f'--stack={s}' for s in args.stack), '--set', f"depth={','.join(map(str, args.depths))}",
            f'--seeds={args.seeds}', f'--out={args.out}', f'--baseline={args.baseline}', f'--nproc={args.nproc}',
            '--progress=0',  # the series' own line counts FLOPs: runs of several sizes cost unlike amounts a step
            *(f'--per={p}' for p in args.per), *extra]


def planned(args):
    """(config name, depth, seed) of every run of the series."""
    return [(stem(c), d, s) for c in args.configs for d in args.depths for s in range(1, args.seeds + 1)]


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def folders(args):
    """{(config name, depth, seed): the run's folder} of the series' runs found in OUT: a folder
    whose name starts with its config's file name (compare.py names them so; the longest name
    wins, 'NAME' or 'NAME-...'), whose config.json holds the depth and seed."""
    names, found = {stem(c) for c in args.configs}, {}
    for entry in sorted(os.listdir(args.out)) if os.path.isdir(args.out) else []:
        mine = [n for n in names if entry == n or entry.startswith((n + '-', n + ' '))]
        cfg = read_json(os.path.join(args.out, entry, 'config.json')) if mine else None
        if not cfg:
            continue
        key = (max(mine, key=len), cfg.get('depth'), cfg.get('seed'))
        if key[1] in args.depths and 1 <= (key[2] or 0) <= args.seeds:
            if key in found:
                raise UserError(f"{args.out} holds two runs of {key[0]} at depth {key[1]}, seed {key[2]}: "
                                f"{found[key]} and {entry}; remove the one that is not of this series, or use another --out")
            found[key] = entry
    return {k: os.path.join(args.out, v) for k, v in found.items()}


def inspect(folder):
    """What a run's folder shows: its config, start record, last iteration, final evaluation (the
    one at max_iters, None before it) and FLOPs per iteration (None before its start record)."""
    cfg, records = read_json(os.path.join(folder, 'config.json')), logs.read(folder)
    start = next((r for r in records if r.get('event') == 'start'), {})
    final = next((r for r in records if 'val_loss' in r and r['iter'] == cfg['max_iters']), None)
    per_iter = start['flops_per_token'] * start['tokens_per_iter'] if 'flops_per_token' in start else None
    log = os.path.join(folder, 'log.jsonl')
    return dict(folder=folder, cfg=cfg, start=start, final=final, per_iter=per_iter,
                iter=max((r['iter'] for r in records), default=0),
                changed=os.path.getmtime(log) if os.path.exists(log) else 0)


def survey(args):
    """{planned run: inspect(its folder), or None where it has none yet}."""
    found = folders(args)
    return {key: inspect(found[key]) if key in found else None for key in planned(args)}


def flops(runs):
    """(FLOPs done, FLOPs of the whole series or None where unknown): the series' runs' training
    FLOPs; a run not started yet counts the mean of its depth's started runs, or a power law in
    depth through the started depths' means (None with fewer than two)."""
    started = {k: r for k, r in runs.items() if r and r['per_iter']}
    done = sum(r['per_iter'] * min(r['iter'], r['cfg']['max_iters']) for r in started.values())
    by_depth = {}
    for (_, depth, _), r in started.items():
        by_depth.setdefault(depth, []).append(r['per_iter'] * r['cfg']['max_iters'])
    means = {d: statistics.mean(v) for d, v in by_depth.items()}
    if len(means) < 2 and len(started) < len(runs):
        return done, None
    slope, offset = np.polyfit(np.log(list(means)), np.log(list(means.values())), 1) if len(means) > 1 else (0, 0)
    total = sum(started[k]['per_iter'] * started[k]['cfg']['max_iters'] if k in started else
                means.get(k[1], math.exp(offset + slope * math.log(k[1]))) for k in runs)
    return done, total


def finished(runs):
    return sum(1 for r in runs.values() if r and r['final'])


def progress_line(runs, speed):
    """'miniseries: N/M runs finished; RUN at iteration I of N; about T left' (the running runs: those
    whose log changed within the speed's window; the time left: the FLOPs left at the speed of that
    window, progress.Speed, which has seen the FLOPs done)."""
    done, total = flops(runs)
    line = f"miniseries: {finished(runs)}/{len(runs)} runs finished"
    if finished(runs) == len(runs):
        return line
    recent = time.time() - speed.window
    line += ''.join(f"; {os.path.basename(r['folder'])} at iteration {r['iter']} of {r['cfg']['max_iters']}"
                    for r in runs.values() if r and not r['final'] and r['changed'] > recent)
    left = None if total is None else speed.left(total - done)
    return line + ("; time left: known once runs of two sizes have run a while" if left is None else
                   f"; about {duration(left)} left at the recent speed")


def run_series(args, extra):
    """compare.py over the whole series, in a session of its own (a Ctrl-C here reaches it once, as
    SIGTERM: its runs save and stop), with a progress line whenever a run finishes and every
    progress.EVERY seconds."""
    runs, speed = survey(args), progress.Speed()
    speed.see(flops(runs)[0])
    print(progress_line(runs, speed).split(';')[0] + " before this command", flush=True)
    proc = subprocess.Popen(compare_argv(args, extra), start_new_session=True, preexec_fn=signals.stop_with_parent)

    def stop(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)
    shown, at = finished(runs), time.time()
    try:
        while proc.poll() is None:
            time.sleep(POLL)
            runs = survey(args)
            speed.see(flops(runs)[0])
            if finished(runs) != shown or time.time() - at > progress.EVERY:
                print(progress_line(runs, speed), flush=True)
                shown, at = finished(runs), time.time()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        print(f"miniseries interrupted with {finished(survey(args))}/{len(runs)} runs finished; the same command keeps "
              "them and runs the rest", flush=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if proc.returncode:
        raise UserError(f"tools/compare.py stopped with exit status {proc.returncode} (its message is above); fix what "
                        "it names and run the same command again: finished runs are kept")


def measured(runs):
    """({config: {depth: [a dict per finished run: seed, folder, loss, bpb, compute, wall_s,
    parameters, flops_per_token]}}, [a dict per run left out: config, depth, seed, folder, why])."""
    series, missing = {}, []
    for (name, depth, seed), r in runs.items():
        if not r or not r['final'] or r['per_iter'] is None or not math.isfinite(r['final']['val_loss']):
            why = ('not run' if not r else 'not finished' if not r['final'] else
                   'no FLOPs in its log (trained before they were logged)' if r['per_iter'] is None else 'non-finite loss')
            missing.append(dict(config=name, depth=depth, seed=seed, folder=r and r['folder'], why=why))
            continue
        series.setdefault(name, {}).setdefault(depth, []).append(dict(
            seed=seed, folder=r['folder'], loss=r['final']['val_loss'], bpb=r['final'].get('val_bpb'),
            compute=r['per_iter'] * r['final']['iter'], wall_s=r['final'].get('train_s'),
            parameters=r['start'].get('parameters'), flops_per_token=r['start']['flops_per_token']))
    return series, missing


def spread(values):
    """{'mean', 'std' (None for one value), 'n'}, or None for no values."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return dict(mean=statistics.mean(values), std=statistics.stdev(values) if len(values) > 1 else None, n=len(values))


def fitted(sizes):
    """scaling.fit over every run of a config, or {'error': why there is none}."""
    points = [(r['compute'], r['loss']) for runs in sizes.values() for r in runs]
    try:
        return scaling.fit(*zip(*points))
    except scaling.NoFit as e:
        return {'error': str(e)}


def analyse(series, baseline):
    """{config: {'fit': Fit or {'error'}, 'sizes': [{depth, parameters, flops_per_token, compute,
    seeds, runs, loss, bpb, wall_s, multiplier, fitted_multiplier}]}}; the multipliers over
    baseline's fit (None for the baseline itself)."""
    fits = {name: fitted(sizes) for name, sizes in series.items()}
    base = fits.get(baseline, {'error': 'it has no finished run'})
    found = {}
    for name, sizes in series.items():
        rows = []
        for depth, runs in sorted(sizes.items()):
            loss, compute = spread([r['loss'] for r in runs]), statistics.mean(r['compute'] for r in runs)
            row = dict(depth=depth, parameters=runs[0]['parameters'], flops_per_token=runs[0]['flops_per_token'],
                       compute=compute, seeds=[r['seed'] for r in runs], runs=runs, loss=loss,
                       bpb=spread([r['bpb'] for r in runs]), wall_s=spread([r['wall_s'] for r in runs]),
                       multiplier=None, fitted_multiplier=None)
            if name != baseline:
                row['multiplier'], row['fitted_multiplier'] = multipliers(base, fits[name], loss, compute)
            rows.append(row)
        found[name] = dict(fit=fits[name], sizes=rows)
    return found


def multipliers(base, rule, loss, compute):
    """(measured, fitted) scaling.Multiplier of a size over the baseline's fit."""
    if isinstance(base, dict):
        none = scaling.Multiplier(None, None, f"the baseline has no fit: {base['error']}")
        return none, none
    se = loss['std'] / math.sqrt(loss['n']) if loss['std'] is not None else 0.0
    measured_m = scaling.multiplier(base, loss['mean'], compute, se)
    fitted_m = (scaling.fitted_multiplier(base, rule, compute) if not isinstance(rule, dict) else
                scaling.Multiplier(None, None, f"no fit: {rule['error']}"))
    return measured_m, fitted_m


def cell(value, se=None, fmt='{:.4f}'):
    if value is None:
        return '-'
    return fmt.format(value) + ('' if se is None or not math.isfinite(se) else ' ± ' + fmt.format(se))


def spread_cell(s, fmt='{:.4f}'):
    return '-' if s is None else cell(s['mean'], s['std'], fmt)


def multiplier_cell(m, notes):
    """A multiplier's cell; its note goes to notes, referred to by number."""
    if m is None:
        return 'baseline'
    if m.note and m.note not in notes:
        notes.append(m.note)
    mark = f" [{notes.index(m.note) + 1}]" if m.note else ''
    if m.value is None:
        return 'none' + mark
    return f"{m.value:.3g}x" + ('' if m.se is None or not math.isfinite(m.se) else f" ± {m.se:.2g}") + mark


def fit_cells(f):
    if isinstance(f, dict):
        return [f"no fit: {f['error']}", '-', '-', '-', '-']
    se = f.se if f.se is not None else [None] * 3
    E = '0 (fixed: no bend toward an asymptote)' if f.E_fixed else cell(f.E, se[0])
    return [E, cell(f.A, se[1], '{:.4g}'), cell(f.alpha, se[2]), str(f.n), f"{f.rss:.3g}"]


def markdown(results, baseline, missing, command, nproc):
    """OUT/miniseries.md: a row per config and size, then the fits."""
    notes = []
    head = ['rule', 'depth', 'parameters', 'FLOPs/token', 'compute (FLOPs)', 'seeds', 'final val loss',
            'final val bpb', 'training time (s)', f'compute multiplier over `{baseline}`, measured', 'fitted']
    lines = [f"`{command}`", '',
             'Final val loss against training compute C (FLOPs per token x tokens per iteration x iterations), '
             'mean ± std over seeds. The compute multiplier of a size: the compute at which the baseline\'s fit '
             'L(C) = E + A·C^(−α) reaches the size\'s mean final loss (measured) or the rule\'s fitted loss '
             '(fitted), over the size\'s compute; ± its standard error by the delta method from the fits\' '
             'least-squares covariance, s² (JᵀJ)⁻¹ (orthogpt/scaling.py).'
             + (f' The runs ran {nproc} at a time: their training times shared the machine.' if nproc > 1 else ''),
             '', '| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for name, r in results.items():
        for s in r['sizes']:
            lines.append('| ' + ' | '.join([
                f"`{name}`", str(s['depth']), f"{s['parameters']:,}" if s['parameters'] else '-',
                f"{s['flops_per_token']:.3g}", f"{s['compute']:.3g}", str(len(s['seeds'])), spread_cell(s['loss']),
                spread_cell(s['bpb']), spread_cell(s['wall_s'], '{:.3g}'),
                multiplier_cell(s['multiplier'], notes), multiplier_cell(s['fitted_multiplier'], notes)]) + ' |')
    lines += ['', '| rule | E | A | α | points | residual sum of squares | fitted multiplier at its largest size |',
              '|---|---|---|---|---|---|---|']
    for name, r in results.items():
        last = r['sizes'][-1]['fitted_multiplier'] if r['sizes'] else None
        lines.append('| ' + ' | '.join([f"`{name}`", *fit_cells(r['fit']), multiplier_cell(last, notes)]) + ' |')
    lines += [''] + [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    lines += [f"- `{m['config']}` depth {m['depth']} seed {m['seed']}: {m['why']}" + (f" ({m['folder']})" if m['folder']
                                                                                        else '') for m in missing]
    return '\n'.join(lines) + '\n'


def as_json(results, baseline, missing, command):
    def fit_json(f):
        if isinstance(f, dict):
            return f
        se = f.se
        return dict(E=f.E, E_fixed=f.E_fixed, A=f.A, alpha=f.alpha, n=f.n, rss=f.rss, span=list(f.span),
                    se=None if se is None else dict(zip(('E', 'A', 'alpha'), map(float, se))),
                    cov=None if f.cov is None else f.cov.tolist())

    def m_json(m):
        return None if m is None else dict(value=m.value, se=m.se, note=m.note)
    rules = {name: dict(fit=fit_json(r['fit']), sizes=[
        dict(s, multiplier=m_json(s['multiplier']), fitted_multiplier=m_json(s['fitted_multiplier']))
        for s in r['sizes']]) for name, r in results.items()}
    return dict(command=command, law='L(C) = E + A * C**-alpha, C in training FLOPs', baseline=baseline,
                uncertainty='least-squares covariance s^2 (J^T J)^-1, propagated by the delta method',
                rules=rules, missing=missing)


def figure(results, path):
    series = {}
    for name, r in results.items():
        sizes, f = r['sizes'], r['fit']
        curve = None
        if not isinstance(f, dict):
            xs = np.geomspace(f.span[0] / 1.5, f.span[1] * 1.5, 50)
            curve = (xs, f.loss(xs))
        series[name] = dict(compute=[s['compute'] for s in sizes], loss=[s['loss']['mean'] for s in sizes],
                            loss_std=[s['loss']['std'] or 0 for s in sizes], fit=curve,
                            wall=[s['wall_s']['mean'] if s['wall_s'] else None for s in sizes])
    plots.scaling(series, path)


def report(args, command):
    """OUT/miniseries.md, .json and .png from the runs' folders; the analysis."""
    series, missing = measured(survey(args))
    if not series:
        raise UserError(f"{args.out} holds no finished run of this series: run it first (the same command)")
    results = analyse({stem(c): series[stem(c)] for c in args.configs if stem(c) in series}, args.baseline)
    text = markdown(results, args.baseline, missing, command, args.nproc)
    files.write_text(os.path.join(args.out, 'miniseries.md'), text)
    record = as_json(results, args.baseline, missing, command)
    files.write_text(os.path.join(args.out, 'miniseries.json'), json.dumps(record, indent=1))
    print(text)
    figure(results, os.path.join(args.out, 'miniseries.png'))
    return results


@errors.entry
def main(argv=None):
    args, extra = parse_args(argv)
    run_series(args, extra)
    return report(args, 'python tools/miniseries.py ' + shlex.join(sys.argv[1:] if argv is None else argv))


if __name__ == '__main__':
    main()
