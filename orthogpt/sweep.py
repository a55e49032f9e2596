"""The experiment engine that tools/compare.py and tools/miniseries.py are command lines of: a
comparison (Spec) planned (orthogpt/planning.py), its runs run (orthogpt/launcher.py) and read back
from their folders into rows, their numbers (orthogpt/stats.py) written as OUT/results.md
(orthogpt/results.py) and OUT/curves.png. In process, so that a tool that runs a comparison
watches its runs through the plan rather than finding them again by their folders' names.
Tuning (--tune) is here too: a plan that depends on the runs of another."""

import itertools
import math
import os
import statistics
from dataclasses import dataclass, field, replace

from orthogpt import compile_choice, files, lock, logs, plots, progress, results, slurm, stats
from orthogpt.errors import UserError
from orthogpt.launcher import Progress, Status, execute, final_loss, finished
from orthogpt.planning import SEEDS, TUNING_SEED, Case, cases, label_of, parse_set, plan


@dataclass
class Spec:
    """A comparison: tools/compare.py's command line, whose docstring tells each field. configs: the
    config files; extra: the --key=value arguments every run gets; lengths: sorted iteration counts."""
    configs: list
    stack: list
    extra: list
    seeds: int
    set: list
    per: list
    baseline: str | None
    nproc: int
    out: str
    tune: list = field(default_factory=list)
    lengths: list | None = None
    switch: list = field(default_factory=list)
    switch_at: int | None = None
    switch_reset: bool = False
    reach: str | None = None
    progress: float = progress.EVERY  # seconds between Progress lines, 0: none
    launcher: str = 'local'  # 'local': train.py processes here; 'slurm': a Slurm job a run (orthogpt/slurm.py)
    sbatch: list = field(default_factory=list)  # sbatch's options for every job (--partition=..., --time=...)
    collect: bool = False  # start and wait for nothing: read the runs as they stand
    compile: str = 'auto'  # 'auto': each run compiles where a probe says it pays (orthogpt/compile_choice.py); 'True', 'False': every run
    probe_iters: int = 40  # --compile=auto: iterations of each probe

    def __post_init__(self):
        if self.probe_iters < 4:
            raise UserError(f"--probe_iters={self.probe_iters}: a probe needs 4 iterations or more (its first log "
                            f"window is its warm-up, the others time its steps)")
        if self.compile != 'auto':
            self.extra = [*self.extra, f'--compile={self.compile}']


def add_launcher_options(parser):
    """The options that say where and how a comparison's runs run, for the command lines of this engine."""
    parser.add_argument('--compile', choices=['auto', 'True', 'False'], default='auto',
                        help="'auto': each model is probed, eager and compiled, and a run compiles where its length "
                             "pays for compiling (OUT/compile.md); True or False: every run")
    parser.add_argument('--probe_iters', type=int, default=40, metavar='N',
                        help='--compile=auto: iterations of each probe (models whose runs have fewer iterations left '
                             'than 10 probes are not probed)')
    parser.add_argument('--launcher', choices=['local', 'slurm'], default='local',
                        help="'local': train.py processes on this machine, --nproc at once; 'slurm': each run a "
                             "Slurm job of tools/slurm/train.sbatch, submitted from here")
    parser.add_argument('--sbatch', default='', metavar="'OPTIONS'",
                        help="sbatch's options for every job, e.g. '--partition=gpu --gpus=1 --time=2:00:00'")
    parser.add_argument('--collect', action='store_true',
                        help='start and wait for nothing: tabulate the runs as they stand, wherever they run')


def run_all(spec, runs, watch):
    """The runs run (spec.launcher), or, with spec.collect, left as they stand."""
    if spec.collect:
        return
    if spec.compile == 'auto' and spec.launcher == 'local':
        compile_choice.choose(runs, spec.probe_iters, spec.out,
                              lambda probes: dispatch(spec, probes, Progress(probes, spec.progress)))
    elif spec.compile == 'auto':
        print("--compile=auto times its probes on this machine, which Slurm's jobs may not run on: the runs run as "
              "their configs say (--compile=True or False sets every run)")
    dispatch(spec, runs, watch)


def dispatch(spec, runs, watch):
    if spec.launcher == 'slurm':
        slurm.execute(runs, spec.sbatch, watch)
    else:
        execute(runs, spec.nproc, watch)


def planned(spec, chosen=None):
    """The runs that report: each case (chosen: the tuned ones, else cases(spec)) x length x
    reported seed."""
    return plan(spec, chosen or cases(spec), SEEDS[:spec.seeds], spec.lengths or (None,))


def compare(spec, command, runs=None, watch=None):
    """The comparison, holding OUT's lock (one comparison per folder; each run's train.py locks its
    own): tuned (spec.tune), its runs (planned(spec), or the caller's `runs`, planned so) run with
    watch (default: a Progress line every spec.progress seconds), read back and written as
    results.md, headed by `command`, and curves.png; the table printed. The rows; Stopped (from
    orthogpt/launcher.py) where a signal stopped the runs."""
    with lock.hold(spec.out):
        chosen, tuning = tune(spec) if spec.tune else (cases(spec), {})
        runs = runs or planned(spec, chosen)
        run_all(spec, runs, watch or Progress(runs, spec.progress))
        rows = read_rows(runs)
        by_length = bool(spec.lengths) and len(spec.lengths) > 1  # the speedup table's
        analysis = stats.analyse(rows, spec.baseline, spec.reach, by_length)
        text = results.report(spec, command, rows, analysis, tuning, {c.label for c in chosen})
        choices = os.path.join(spec.out, 'compile.md')
        if os.path.exists(choices):  # which runs compiled, beside the times they took
            with open(choices) as f:
                text += '\n' + f.read()
        files.write_text(os.path.join(spec.out, 'results.md'), text)
        print(text)
        plots.curves({label: [r.log for r in row.results] for label, row in rows.items()},
                     os.path.join(spec.out, 'curves.png'), spec.switch_at)
        return rows


def tune(spec):
    """(the cases, each with the --tune setting of the lowest final val loss on the tuning seed
    appended; {tuning run's label: its final val loss}); a geometric grid whose best value lies on
    its edge is extended (twice at most on a side)."""
    keys = [t.partition('=')[0] for t in spec.tune]
    grids = {c.label: {k: [v for _, v in parse_set(t)] for k, t in zip(keys, spec.tune)} for c in cases(spec)}
    added = {}
    while True:
        todo = [replace(c, setting=(*c.setting, *zip(grid, combo)))
                for c in cases(spec) for grid in [grids[c.label]] for combo in itertools.product(*grid.values())]
        runs = plan(spec, todo, [TUNING_SEED])
        run_all(spec, runs, Progress(runs, spec.progress))
        waiting = [r.name for r in runs if not finished(r)]
        if spec.collect and waiting:
            raise UserError(f"--collect: {len(waiting)} of the {len(runs)} tuning runs have not finished ("
                            f"{', '.join(waiting[:3])}{', ...' if len(waiting) > 3 else ''}), and the reported seeds "
                            f"follow from them; run the command without --collect to run or wait for them")
        best = {}
        for r in sorted(runs, key=final_loss):
            best.setdefault(r.case.label, dict(r.case.setting[-len(keys):]))
        wider = {label: {k: extend(vs, best[label][k], added, (label, k)) for k, vs in grid.items()}
                 for label, grid in grids.items()}
        if wider == grids:
            chosen = [replace(c, setting=(*c.setting, *best[c.label].items()),
                              label=label_of(c.label, best[c.label].items())) for c in cases(spec)]
            return chosen, {r.group: final_loss(r) for r in runs}
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


@dataclass
class Result:
    """A finished run's numbers, read from its log."""
    seed: int
    best: float  # val loss
    final: float  # val loss at max_iters
    top1: float | None  # final top-1 and top-5 % (images)
    top5: float | None
    wall: float | None  # seconds; a second phase's include its first phase's
    unit: str | None  # 'tok' or 'img'
    rate: float | None  # the median of its log lines' tokens (images) per second
    ms: float | None  # the median of its log lines' ms per iteration
    curve: list  # logs.evaluations: [(iteration, val loss, top-1)]
    log: list = field(default_factory=list)  # its log's records, for the figure


@dataclass
class Failure:
    """A run that did not finish: why, and the last lines it (or its first phase) printed."""
    name: str
    why: str
    tail: str


@dataclass
class Row:
    """A row of the results: the runs of one case (at one length, or one switch value) over the
    seeds, those that finished and those that did not."""
    label: str
    case: Case
    length: int | None = None
    switch: tuple = ()
    params: int | None = None  # parameter count, as train.py logged it
    results: list = field(default_factory=list)  # [Result], in seed order
    failed: list = field(default_factory=list)  # [Failure]


def read_rows(runs):
    """{label: Row} in plan order, from the runs' folders; first phases count in no row."""
    rows = {}
    for run in runs:
        if run.group is None:
            continue
        row = rows.setdefault(run.group, Row(run.group, run.case, run.length, run.switch))
        log = logs.read(run.out_dir)
        row.params = row.params or next((x['parameters'] for x in log if x.get('event') == 'start'), None)
        if finished(run):
            row.results.append(result(run, log))
        else:
            row.failed.append(failure(run))
    return rows


def result(run, log):
    """A finished run's Result; a second phase's wall time includes its first phase's."""
    evals = [x for x in log if 'val_loss' in x]
    wall = Status.read(run).wall_s
    if run.after and wall is not None:
        first_wall = Status.read(run.after).wall_s
        wall = None if first_wall is None else wall + first_wall
    unit = next((k[:-len('_per_s')] for x in log for k in x if k.endswith('_per_s')), None)
    rates = [x[f'{unit}_per_s'] for x in log if f'{unit}_per_s' in x]
    steps = [x['ms_per_iter'] for x in log if 'ms_per_iter' in x]
    return Result(seed=run.seed, best=min(x['val_loss'] for x in evals), final=evals[-1]['val_loss'],
                  top1=evals[-1].get('top1'), top5=evals[-1].get('top5'), wall=wall, unit=unit,
                  rate=statistics.median_high(rates) if rates else None,
                  ms=statistics.median_high(steps) if steps else None, curve=logs.evaluations(log), log=log)


def failure(run):
    """Why run did not finish: its own exit, or, never run, its first phase's."""
    status = Status.read(run)
    if status.returncode is None and run.after and not finished(run.after):
        first = Status.read(run.after)
        why = f"its first phase {run.after.name} did not finish" + (
            '' if first.returncode is None else f", exit {first.returncode}")
        return Failure(run.name, why, first.tail)
    why = 'not run' if status.returncode is None else f"exit {status.returncode}" + (
        ', stopped before max_iters' if status.returncode == 0 else '')
    return Failure(run.name, why, status.tail)
