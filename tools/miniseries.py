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

The runs: the comparison of `python tools/compare.py CONFIGS [--stack=...] --set depth=D1,D2,.. --seeds=N
--out=OUT --baseline=BASE --nproc=N [--per ...] [--key=value ...]`, run in this process by the engine
compare.py is a command line of (orthogpt/sweep.py), so a run is
`python train.py CONFIG [STACK] [--key=value ...] --depth=D --seed=S` in its own folder under OUT.
The depth comes after the other keys, and its rule (python train.py --help) sets n_layer = n_head =
D, n_embd = aspect x D and, with tokens_per_param > 0, max_iters from a budget of tokens_per_param
tokens per parameter of the blocks; it scales the learning_rate set before it to the width. So
--aspect sets the width per layer, --tokens_per_param the budget, and --max_iters goes with
--tokens_per_param=0.

As compare.py does, it keeps finished runs, resumes interrupted ones from their checkpoints and writes
OUT/results.md (the paired differences at each depth) and OUT/curves.png: the same command after an
interruption (Ctrl-C, SIGTERM) finishes the series without rerunning what finished. While it runs,
a line (whenever a run finishes, and every 30 s) tells how many runs have finished, the iteration of
each running one, and about how long the rest will take: the FLOPs left at the speed of the last two
minutes (those of a size not started yet extrapolated from the sizes started, as a power of the
depth).

Then, from each planned run's folder (config.json: its max_iters; log.jsonl: its parameters, FLOPs
per token, tokens per iteration, final val loss, val_bpb and training seconds), it fits
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
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)
from orthogpt import errors, files, launcher, plots, progress, series, sweep  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402
from orthogpt.estimate import duration  # noqa: E402
from orthogpt.planning import config_name  # noqa: E402
from orthogpt.results import markdown as table_lines  # noqa: E402

POLL = 2.0  # seconds between looks at the run folders
COMPARES = ('set', 'tune', 'lengths', 'switch', 'switch_at', 'switch_reset', 'reach')  # compare.py's, not the series'
OWN = {'depth': 'the sizes go as --depths=D1,D2,...', 'seed': 'the seeds are 1..--seeds',
       'out_dir': 'the runs go under --out', **dict.fromkeys(
           ('n_layer', 'n_head', 'n_embd'), 'depth sets n_layer = n_head = depth and n_embd = aspect x depth; '
                                            'give the width per layer with --aspect')}


def parse_args(argv):
    """(the arguments, checked; the comparison of the series' runs, a sweep.Spec)."""
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
    sweep.add_launcher_options(p)
    args, extra = p.parse_known_args(argv)
    check(args, extra)
    return args, sweep.Spec(configs=args.configs, stack=args.stack, extra=extra, seeds=args.seeds,
                            set=[f"depth={','.join(map(str, args.depths))}"], per=args.per, baseline=args.baseline,
                            nproc=args.nproc, out=args.out, launcher=args.launcher, sbatch=shlex.split(args.sbatch),
                            collect=args.collect, compile=args.compile, probe_iters=args.probe_iters)


def check(args, extra):
    """UserError for input the series cannot run with, naming the fix."""
    for c in args.configs:
        if not os.path.isfile(c):
            raise UserError(f"config file {c!r} not found; the configs live in config/, e.g. config/shakespeare_add.py")
    names = [config_name(c) for c in args.configs]
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
    args.baseline = config_name(args.baseline) if args.baseline else names[0]
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


class Watch:
    """The series' progress line while the engine runs it: the runs' folders looked at every POLL
    seconds and whenever a run ends, the line printed whenever a run finishes and every
    progress.EVERY seconds (the engine's own line counts iterations: runs of several sizes cost
    unlike amounts a step)."""

    def __init__(self, runs):
        self.runs, self.speed, self.pending = runs, progress.Speed(), None
        seen = series.survey(runs)
        self.speed.see(series.flops(seen)[0])
        self.shown, self.at = series.finished(seen), time.monotonic()
        self.looked = self.at
        print(progress_line(seen, self.speed).split(';')[0] + " before this command", flush=True)

    def tick(self, todo, running):
        """launcher.launch's look: todo, the runs not started; running, the Jobs."""
        if time.monotonic() - self.looked < POLL and len(todo) + len(running) == self.pending:
            return
        self.looked, self.pending = time.monotonic(), len(todo) + len(running)
        seen = series.survey(self.runs)
        self.speed.see(series.flops(seen)[0])
        if series.finished(seen) != self.shown or time.monotonic() - self.at > progress.EVERY:
            print(progress_line(seen, self.speed), flush=True)
            self.shown, self.at = series.finished(seen), time.monotonic()


def progress_line(runs, speed):
    """'miniseries: N/M runs finished; RUN at iteration I of N; about T left' of a survey (the running
    runs: those whose log changed within the speed's window; the time left: the FLOPs left at the
    speed of that window, progress.Speed, which has seen the FLOPs done)."""
    done, total = series.flops(runs)
    line = f"miniseries: {series.finished(runs)}/{len(runs)} runs finished"
    if series.finished(runs) == len(runs):
        return line
    recent = time.time() - speed.window
    line += ''.join(f"; {os.path.basename(r['folder'])} at iteration {r['iter']} of {r['cfg']['max_iters']}"
                    for r in runs.values() if r and not r['final'] and r['changed'] > recent)
    left = None if total is None else speed.left(total - done)
    return line + ("; time left: known once runs of two sizes have run a while" if left is None else
                   f"; about {duration(left)} left at the recent speed")


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
             '', *table_lines(head, [[
                 f"`{name}`", str(s['depth']), f"{s['parameters']:,}" if s['parameters'] else '-',
                 f"{s['flops_per_token']:.3g}", f"{s['compute']:.3g}", str(len(s['seeds'])), spread_cell(s['loss']),
                 spread_cell(s['bpb']), spread_cell(s['wall_s'], '{:.3g}'), multiplier_cell(s['multiplier'], notes),
                 multiplier_cell(s['fitted_multiplier'], notes)] for name, r in results.items() for s in r['sizes']]),
             '', *table_lines(['rule', 'E', 'A', 'α', 'points', 'residual sum of squares',
                               'fitted multiplier at its largest size'],
                              [[f"`{name}`", *fit_cells(r['fit']),
                                multiplier_cell(r['sizes'][-1]['fitted_multiplier'] if r['sizes'] else None, notes)]
                               for name, r in results.items()])]
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


def report(args, runs, command):
    """OUT/miniseries.md, .json and .png from the folders of the runs (series.keyed); the analysis."""
    measured, missing = series.measured(series.survey(runs))
    if not measured:
        raise UserError(f"{args.out} holds no finished run of this series: run it first (the same command)")
    results = series.analyse(measured, args.baseline)
    text = markdown(results, args.baseline, missing, command, args.nproc)
    files.write_text(os.path.join(args.out, 'miniseries.md'), text)
    record = as_json(results, args.baseline, missing, command)
    files.write_text(os.path.join(args.out, 'miniseries.json'), json.dumps(record, indent=1))
    print(text)
    figure(results, os.path.join(args.out, 'miniseries.png'))
    return results


@errors.entry
def main(argv=None):
    """The series' comparison, run by the engine in this process, then its report."""
    args, spec = parse_args(argv)
    command = 'python tools/miniseries.py ' + shlex.join(sys.argv[1:] if argv is None else argv)
    runs = series.keyed(sweep.planned(spec))
    try:
        sweep.compare(spec, command, list(runs.values()), Watch(runs))
    except launcher.Stopped:  # the runs have saved their checkpoints
        print(f"miniseries interrupted with {series.finished(series.survey(runs))}/{len(runs)} runs finished; the "
              "same command keeps them and runs the rest", flush=True)
        raise
    return report(args, runs, command)


if __name__ == '__main__':
    main()
