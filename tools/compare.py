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
--switch_at); where the runs evaluate fewer than 5 times, their training loss from the log lines.

While the runs run, a line every --progress seconds (30) names the runs done, the iteration of each
running one and the time left at the speed of the last two minutes.
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
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: train.py
sys.path.insert(0, ROOT)
import configure  # noqa: E402
from orthogpt import errors, files, lock, logs, plots, progress, resume, signals  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402
from orthogpt.estimate import duration, thread_share  # noqa: E402

TUNING_SEED = 1337
SEEDS = list(range(1, 100))  # the reported ones

# ----------------------------------------------------------------------------- 1. records


@dataclass(frozen=True)
class Case:
    """A config at one combination of --set values; its runs make a row (a row per length, or per
    switch value, with --lengths or --switch)."""
    config: str  # the config file
    name: str  # its file name without .py: how --per, --baseline and the labels call it
    set: tuple  # its --set values, ((key, value), ...): the keys a --baseline pairs rows over
    setting: tuple  # its --per settings, then its --set values (then, once tuned, its --tune values)
    label: str  # its rows' label


@dataclass(eq=False)  # a run is its folder: two runs with the same fields are still two runs
class Run:
    """One train.py process in its own folder, OUT/name. A first phase (--switch) counts in no row:
    its second phases continue it, one per switch value."""
    name: str
    seed: int
    argv: list  # train.py's arguments
    out_dir: str
    cfg: Any  # configure.load(argv), checked before any run starts
    case: Case
    group: str | None  # the label of the row it counts in; None for a first phase
    length: int | None = None  # its max_iters under --lengths
    after: 'Run | None' = None  # the first phase a second phase continues
    reset: bool = False  # --switch_reset: a fresh optimizer and schedule after the switch
    switch: tuple = ()  # a second phase's --switch values


@dataclass
class Job:
    """A run's train.py while it runs."""
    run: Run
    proc: subprocess.Popen
    stdout: object  # the run's stdout.log, open
    t0: float


@dataclass
class Status:
    """What a run's last process left: run.json (written by compare.py when it ended) and the last
    3 lines it printed. None where compare.py never ran it (or train.py ran it by itself)."""
    returncode: int | None = None
    wall_s: float | None = None
    argv: list | None = None  # the train.py arguments it ran with
    tail: str = ''

    @classmethod
    def read(cls, run):
        try:
            with open(os.path.join(run.out_dir, 'run.json')) as f:
                saved = json.load(f)
            status = cls(saved.get('returncode'), saved.get('wall_s'), saved.get('argv'))
        except (OSError, json.JSONDecodeError):
            status = cls()
        try:
            with open(os.path.join(run.out_dir, 'stdout.log')) as f:
                status.tail = ' | '.join(line.strip() for line in f.read().splitlines()[-3:])
        except OSError:
            pass
        return status


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

# ----------------------------------------------------------------------------- 2. planning


def parse_set(text):
    key, sep, values = text.partition('=')
    if not sep or not values:
        raise UserError(f"--set {text!r}: write --set key=v1,v2,...")
    return [(key, v) for v in values.split(',')]


def parse_per(text):
    """--per 'CONFIG[ key=value ...]:KEY=VALUE', a setting for the runs of one config (and, where
    given, of its --set values) alone: (config name, {key: value} it selects, (key, value))."""
    selector, colon, kv = text.partition(':')
    key, eq, value = kv.partition('=')
    stem, *picks = selector.split() or ['']
    if not stem or not colon or not eq or not key or not value or not all('=' in p for p in picks):
        raise UserError(f"--per {text!r}: write --per CONFIG:key=value or --per 'CONFIG k=v:key=value' (CONFIG: a "
                        f"config file's name, k=v: a --set value)")
    return config_name(stem), dict(p.split('=', 1) for p in picks), (key, value)


def config_name(path):
    return os.path.splitext(os.path.basename(path))[0]


def load(argv, name):
    try:
        return configure.load(argv)
    except UserError as e:
        raise UserError(f"{e} (run {name})") from None


def label_of(name, setting):
    return name + ''.join(f" {k}={v}" for k, v in setting)


def cases(args):
    """Every config x --set combination, a Case each, with the --per settings that select it."""
    settings = list(itertools.product(*[parse_set(s) for s in args.set])) or [()]
    per = [parse_per(p) for p in args.per]
    names = {config_name(c) for c in args.configs}
    for text, (name, picks, _) in zip(args.per, per):
        if name not in names or not any(picks.items() <= dict(values).items() for values in settings):
            raise UserError(f"--per {text!r} selects no run: the configs are {', '.join(sorted(names))}"
                            + (f", the --set values {', '.join(s for s in args.set)}" if args.set else ''))
    found = []
    for config in args.configs:
        name = config_name(config)
        for values in settings:
            setting = (*(kv for n, picks, kv in per if n == name and picks.items() <= dict(values).items()), *values)
            found.append(Case(config, name, values, setting, label_of(name, setting)))
    return found


def plan(args, extra, todo, seeds, lengths=(None,)):
    """The runs of each case in todo x length x seed (with --switch, a first phase and its second
    phases), each argv checked with configure.load first, so that a typo stops the comparison
    before any run starts."""
    switches = list(itertools.product(*[parse_set(s) for s in args.switch])) if args.switch else []
    runs = []
    for case in todo:
        for length in lengths:
            setting = (*case.setting, *((('max_iters', length),) if length else ()))
            label = label_of(case.name, setting)
            stem = label.replace(' ', '-').replace('=', '')
            argv = [case.config, *args.stack, *extra, *(f'--{k}={v}' for k, v in setting)]
            for seed in seeds:
                if switches:
                    add_phases(args, runs, switches, argv, stem, seed, case=case, group=label)
                else:
                    add_run(args, runs, f'{stem}-s{seed}', seed, argv, case=case, group=label, length=length)
    return runs


def add_run(args, runs, name, seed, argv, **where):
    """Appends to runs and returns the run of argv in OUT/name, its config loaded."""
    if any(r.name == name for r in runs):
        raise UserError(f"two runs would share the folder {name}: give the configs distinct file names")
    out_dir = os.path.join(args.out, name)
    argv = [*argv, f'--seed={seed}', f'--out_dir={out_dir}']
    runs.append(Run(name, seed, argv, out_dir, load(argv, name), **where))
    return runs[-1]


def add_phases(args, runs, switches, argv, stem, seed, case, group):
    """A first phase up to --switch_at (in the full run's schedule, or a complete run of its own
    with --switch_reset), then a second phase per --switch value that continues it to max_iters."""
    cfg = load(argv, stem)
    if not 0 < args.switch_at < cfg.max_iters:
        raise UserError(f"--switch_at={args.switch_at} must lie between 0 and max_iters={cfg.max_iters}")
    decay = cfg.max_iters if cfg.lr_decay_iters is None else cfg.lr_decay_iters
    first_decay = args.switch_at if args.switch_reset else decay
    first = add_run(args, runs, f'{stem}-first{args.switch_at}-s{seed}', seed,
                [*argv, f'--max_iters={args.switch_at}', f'--lr_decay_iters={first_decay}'], case=case, group=None)
    for switch in switches:
        second = add_run(args, runs, f"{stem}-then-{'-'.join(f'{k}{v}' for k, v in switch)}-s{seed}", seed,
                     [*argv, *(f'--{k}={v}' for k, v in switch), f'--lr_decay_iters={decay}'], case=case,
                     group=group + ' → ' + ' '.join(f"{k}={v}" for k, v in switch), after=first,
                     reset=args.switch_reset, switch=tuple(switch))
        problems = resume.problems(first.cfg, second.cfg)
        if problems:
            raise UserError(f"--switch: {second.name} cannot continue {first.name}: " + '; '.join(problems))


def tune(args, extra):
    """(the cases, each with the --tune setting of the lowest final val loss on the tuning seed
    appended; {tuning run's label: its final val loss}); a geometric grid whose best value lies on
    its edge is extended (twice at most on a side)."""
    keys = [t.partition('=')[0] for t in args.tune]
    grids = {c.label: {k: [v for _, v in parse_set(t)] for k, t in zip(keys, args.tune)} for c in cases(args)}
    added = {}
    while True:
        todo = [replace(c, setting=(*c.setting, *zip(grid, combo)))
                for c in cases(args) for grid in [grids[c.label]] for combo in itertools.product(*grid.values())]
        runs = plan(args, extra, todo, [TUNING_SEED])
        execute(runs, args.nproc, args.progress)
        best = {}
        for r in sorted(runs, key=final_loss):
            best.setdefault(r.case.label, dict(r.case.setting[-len(keys):]))
        wider = {label: {k: extend(vs, best[label][k], added, (label, k)) for k, vs in grid.items()}
                 for label, grid in grids.items()}
        if wider == grids:
            chosen = [replace(c, setting=(*c.setting, *best[c.label].items()),
                              label=label_of(c.label, best[c.label].items())) for c in cases(args)]
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

# ----------------------------------------------------------------------------- 3. running


def finished(run):
    return any(r['iter'] == run.cfg.max_iters and 'val_loss' in r for r in logs.read(run.out_dir))


def final_loss(run):
    """A finished run's final val loss; inf for one that failed (diverged, say)."""
    evals = logs.evaluations(logs.read(run.out_dir))
    return evals[-1][1] if finished(run) and math.isfinite(evals[-1][1]) else math.inf


def execute(runs, nproc, every):
    """Run the unfinished runs, nproc at a time, with a progress line every `every` seconds (0: none);
    records each one's exit status and wall time."""
    todo = [r for r in runs if not finished(r)]
    for r in runs:
        if r not in todo:
            keep(r)
    env = dict(os.environ)
    env.setdefault('OMP_NUM_THREADS', str(thread_share(nproc)))
    running = []

    def terminate(signum, frame):  # Ctrl-C in a terminal reaches the runs by itself, SIGTERM does not
        for job in running:
            job.proc.terminate()
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, terminate)
    try:
        launch(todo, running, nproc, env, torch.cuda.device_count(), Progress(runs, every))
    except KeyboardInterrupt:  # let the runs save their checkpoints
        for job in running:
            job.proc.wait()
        raise SystemExit("interrupted; the same command resumes the unfinished runs")
    finally:
        signal.signal(signal.SIGTERM, before)


class Progress:
    """The progress line of a set of runs, every `every` seconds: the runs done, the iteration of each
    running one, and the time left at the speed of the last progress.WINDOW seconds, in iterations
    (a run of another size costs more or less a step: the estimate follows as it runs)."""

    def __init__(self, runs, every):
        self.runs, self.every, self.speed = runs, every, progress.Speed()
        self.looked = self.shown = time.monotonic()
        self.look()

    def look(self):
        """{run: iterations(run)}, their work done seen by the speed."""
        self.looked, done = time.monotonic(), {run: iterations(run) for run in self.runs}
        self.speed.see(sum(it - first for it, first, _ in done.values()))
        return done

    def tick(self, todo, running):
        """Looks at the runs every few seconds and prints the line when it is due: todo, the runs not
        started; running, the Jobs."""
        if not self.every or time.monotonic() - self.looked < min(5, self.every):
            return
        done = self.look()
        if time.monotonic() - self.shown < self.every:
            return
        self.shown = time.monotonic()
        left = self.speed.left(sum(last - it for it, _, last in done.values()))
        at = ''.join(f"; {job.run.name} at iteration {done[job.run][0]} of {done[job.run][2]}" for job in running)
        print(f"progress: {len(self.runs) - len(todo) - len(running)}/{len(self.runs)} runs done{at}; "
              + (f"about {duration(left)} left at the recent speed" if left is not None else
                 "the time left is known once the runs have logged iterations"), flush=True)


def iterations(run):
    """(the iteration its log has reached, where it started, where it ends): a second phase starts where
    its first phase ends."""
    first = run.after.cfg.max_iters if run.after else 0
    last = run.cfg.max_iters
    return min(max(max((r['iter'] for r in logs.read(run.out_dir)), default=0), first), last), first, last


def keep(run):
    """A run that finished before is kept where its folder holds a run of its config."""
    other = trained_otherwise(run)
    if other:
        raise UserError(f"{run.out_dir} holds a run of another config ("
                        + ', '.join(f"{k}: {mine!r} here, {there!r} there" for k, (mine, there) in other.items())
                        + "); give this comparison another --out, or remove that folder to run it again")
    print(f"{run.name}: finished before, kept")


def trained_otherwise(run):
    """{key: (run's value, the value of the run in run's folder)} where the two configs differ, but
    for out_dir: a folder may hold a run that another comparison trained with the same config (a link)."""
    before = Status.read(run).argv
    if before is None:  # never run by compare.py
        return {}
    ours, theirs = asdict(run.cfg), asdict(load(before, run.name))
    return {k: (ours[k], theirs[k]) for k in ours if k != 'out_dir' and ours[k] != theirs[k]}


def start(run):
    """(train.py's argv for run, whether it resumes). A second phase starts from a copy of its first
    phase's checkpoint and log, and resets the optimizer (--switch_reset) only while that copy is
    its checkpoint."""
    ckpt = os.path.join(run.out_dir, 'ckpt.pt')
    os.makedirs(run.out_dir, exist_ok=True)
    if run.after and not os.path.exists(ckpt):
        for f in ('ckpt.pt', 'log.jsonl'):
            shutil.copy2(os.path.join(run.after.out_dir, f), os.path.join(run.out_dir, f))
    resuming = os.path.exists(ckpt)
    reset = run.reset and filecmp.cmp(ckpt, os.path.join(run.after.out_dir, 'ckpt.pt'), shallow=False)
    return ([sys.executable, os.path.join(ROOT, 'train.py'), *run.argv] + (['--init_from=resume'] if resuming else [])
            + (['--reset_optimizer=True'] if reset else [])), resuming


def launch(todo, running, nproc, env, gpus, shown):
    """Keeps nproc runs going (Jobs in running) until every run in todo has ended, their Progress
    shown; a second phase waits until its first has exited and is dropped (reported as not run) when
    that one did not finish."""
    slot = 0

    def waits(run):  # its first phase has not exited: it logs its last evaluation before its checkpoint
        return run.after is not None and any(run.after is r for r in todo + [job.run for job in running])

    while todo or running:
        for run in [r for r in todo if r.after and not waits(r) and not finished(r.after)]:
            todo.remove(run)
            print(f"{run.name}: not run, its first phase {run.after.name} did not finish")
        ready = [r for r in todo if not waits(r)]
        while ready and len(running) < nproc:
            run = ready.pop(0)
            todo.remove(run)
            running.append(spawn(run, dict(env, CUDA_VISIBLE_DEVICES=str(slot % gpus)) if gpus > 1 else env))
            slot += 1
        time.sleep(0.2)
        for job in [j for j in running if j.proc.poll() is not None]:
            running.remove(job)
            ended(job)
        shown.tick(todo, running)


def spawn(run, env):
    """Starts run's train.py, its output appended to its stdout.log."""
    argv, resuming = start(run)
    out = open(os.path.join(run.out_dir, 'stdout.log'), 'a')
    # if compare.py dies (SIGKILL included), its runs get SIGTERM: they save and stop
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=signals.stop_with_parent)
    print(f"{run.name}: {'resumed' if resuming else 'started'}")
    return Job(run, proc, out, time.time())


def ended(job):
    """Writes a run's run.json (its exit status, wall time and arguments) once its process exited."""
    job.stdout.close()
    status = {'returncode': job.proc.returncode, 'wall_s': time.time() - job.t0, 'argv': job.run.argv}
    files.write_text(os.path.join(job.run.out_dir, 'run.json'), json.dumps(status))
    print(f"{job.run.name}: {'done' if finished(job.run) else 'FAILED'} (exit {status['returncode']}, "
          f"{status['wall_s']:.0f} s)")

# ----------------------------------------------------------------------------- 4. reading the runs back


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

# ----------------------------------------------------------------------------- 5. analysis


@dataclass(frozen=True)
class Estimate:
    """A mean over n seeds with its spread: the sample std of the values, or the standard error of
    a paired difference; spread None for a single seed."""
    mean: float
    spread: float | None
    n: int


@dataclass
class Summary:
    """A row's numbers over its finished seeds: each None where there is none."""
    best: Estimate | None  # best val loss, mean ± std
    final: Estimate | None  # final val loss, mean ± std
    top1: Estimate | None
    top5: Estimate | None
    diff: Estimate | None  # final val loss minus its baseline's, paired by seed: mean ± s.e.
    reached: list  # per seed, the first evaluated iteration at most at the --reach target (None: never)
    rate: float | None  # the median of the runs' throughputs
    unit: str | None  # that of the last finished run
    wall: float | None  # the runs' mean wall time


@dataclass
class Speedup:
    """A case's row in the speedup table: the nGPT paper's protocol (module docstring)."""
    case: str
    params: int | None
    finals: dict  # {length: Estimate of the final val loss, or None}
    target: float  # the baseline's mean final val loss at the longest length
    steps: float  # where the case reaches the target (how: '=' interpolated, '<=' or '>' a bound)
    how: str
    in_steps: float | None  # the longest length over steps, where reached
    ms: float | None  # the median ms/iter of its runs
    time: float | None  # seconds to the target, where reached and its baseline is timed
    in_time: float | None


@dataclass
class Analysis:
    """Everything results.md reports of the rows, as numbers."""
    baseline: str  # its selector, as the table's head names it
    target: float | None  # --reach's val loss
    summaries: dict  # {row's label: Summary}
    lengths: list | None = None  # with the speedup table: its lengths and rows
    speedups: list | None = None


def analyse(rows, baseline=None, reach=None, by_length=False):
    """The Analysis of rows: their summaries against --baseline and --reach and, by_length (two
    --lengths or more), the nGPT protocol's speedups."""
    target = reach_target(rows, reach) if reach else None
    base, against = baseline_of(rows, baseline)
    summaries = {label: summary(row, rows[against[label]] if against[label] not in (None, label) else None, target)
                 for label, row in rows.items()}
    analysis = Analysis(base, target, summaries)
    if by_length:
        analysis.lengths, analysis.speedups = speedups(rows, against)
    return analysis


def estimate(values):
    """Mean ± sample std of values; None for none."""
    if not values:
        return None
    return Estimate(statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None, len(values))


def paired(row, base):
    """Row's final val loss minus base's over the seeds both finished: mean ± standard error
    (std / sqrt(n)); None for no common seed."""
    mine, theirs = ({r.seed: r.final for r in x.results} for x in (row, base))
    diffs = [mine[s] - theirs[s] for s in mine if s in theirs]
    if not diffs:
        return None
    return Estimate(statistics.mean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None,
                    len(diffs))


def mean_final(row):
    return statistics.mean(r.final for r in row.results)


def summary(row, base, target):
    """Row's Summary; base: its baseline's row (None: no paired difference); target: --reach's."""
    ok = row.results
    rates, walls = [r.rate for r in ok if r.rate], [r.wall for r in ok if r.wall is not None]
    return Summary(
        best=estimate([r.best for r in ok]), final=estimate([r.final for r in ok]),
        top1=estimate([r.top1 for r in ok if r.top1 is not None]),
        top5=estimate([r.top5 for r in ok if r.top5 is not None]),
        diff=paired(row, base) if base else None,
        reached=[] if target is None else [next((it for it, loss, _ in r.curve if loss <= target), None) for r in ok],
        rate=statistics.median_high(rates) if rates else None, unit=ok[-1].unit if ok else None,
        wall=statistics.mean(walls) if walls else None)


def reach_target(rows, reach):
    """--reach's val loss: a number, or a row's mean final val loss."""
    try:
        return float(reach)
    except ValueError:
        if reach not in rows or not rows[reach].results:
            raise UserError(f"--reach {reach!r} names no finished group; the groups: {', '.join(rows)}") from None
        return mean_final(rows[reach])


def baseline_of(rows, selector):
    """(the baseline's label, {row: the label of the baseline's row at the same length and switch
    value, or None}). selector: a config's file name, compared at each row's own --set values (the
    first config's by default), or 'CONFIG k=v ...', that config at the --set values it names and at
    each row's own values of the others."""
    name, *picks = (selector or next(iter(rows.values())).case.name).split()
    if not all('=' in p for p in picks):
        raise UserError(f"--baseline {selector!r}: write CONFIG or 'CONFIG key=value ...' (a --set value)")
    picks = dict(p.split('=', 1) for p in picks)

    def key(row):
        return tuple((k, v) for k, v in row.case.set if k not in picks), row.length, row.switch
    at = {key(row): label for label, row in rows.items()
          if row.case.name == name and picks.items() <= dict(row.case.set).items()}
    if not at:
        raise UserError(f"--baseline {selector!r} names no row; the configs: "
                        f"{', '.join(dict.fromkeys(row.case.name for row in rows.values()))}")
    against = {label: at.get(key(row)) for label, row in rows.items()}
    return ' '.join([name, *(f'{k}={v}' for k, v in picks.items())]), against


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


def speedups(rows, against):
    """(the lengths, a Speedup per case whose baseline finished at the longest length)."""
    by_case = {}
    for row in rows.values():
        by_case.setdefault(row.case.label, {})[row.length] = row
    lengths = sorted({n for at in by_case.values() for n in at})
    found = [speedup(case, at, lengths[-1], rows, against) for case, at in by_case.items()]
    return lengths, [s for s in found if s]


def speedup(case, at, longest, rows, against):
    """case's Speedup from its rows at each length (at: {length: Row}); None without a target."""
    base = against[at[longest].label] if longest in at else None
    points = [(n, mean_final(row)) for n, row in at.items() if row.results]
    if base is None or not rows[base].results or not points:
        return None
    target = mean_final(rows[base])
    steps, how = crossing(points, target)
    ms, base_ms = ms_of(at.values()), ms_of([rows[against[row.label]] for row in at.values() if against[row.label]])
    known = how == '=' and ms and base_ms
    return Speedup(case, params=next(iter(at.values())).params,
                   finals={n: estimate([r.final for r in row.results]) for n, row in at.items()},
                   target=target, steps=steps, how=how, in_steps=longest / steps if how == '=' else None, ms=ms,
                   time=steps * ms / 1e3 if known else None,
                   in_time=longest * base_ms / (steps * ms) if known else None)


def ms_of(rows):
    """The median ms/iter of the rows' finished runs; None where none was timed."""
    ms = [r.ms for row in rows for r in row.results if r.ms]
    return statistics.median(ms) if ms else None

# ----------------------------------------------------------------------------- 6. rendering


def markdown(head, body):
    """The lines of a markdown table."""
    return ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head),
            *('| ' + ' | '.join(cells) + ' |' for cells in body)]


def shown(e, fmt):
    """An Estimate as 'mean ± std' (or the value alone, for one seed); '-' for none."""
    if e is None:
        return '-'
    return fmt.format(e.mean) if e.spread is None else f"{fmt.format(e.mean)} ± {fmt.format(e.spread)}"


def shown_diff(e):
    if e is None:
        return '-'
    return f"{e.mean:+.4f} (n=1)" if e.spread is None else f"{e.mean:+.4f} ± {e.spread:.4f} (n={e.n})"


def table(rows, analysis, reach=False, timed=True):
    """The results table: parameters, best and final val loss, the paired difference of the final
    one against the baseline; with reach a column of when each seed first reached the target;
    timed: the runs' throughput and wall time. The failed runs are named under it."""
    images = any(s.top1 is not None for s in analysis.summaries.values())
    head = ['run', 'parameters', 'seeds', 'best val loss', 'final val loss'] + \
        (['top-1 %', 'top-5 %'] if images else []) + [f"Δ final vs `{analysis.baseline}` (paired, ± s.e.)"] + \
        ([f"reaches {analysis.target:.4f} at (per seed)"] if reach else []) + \
        (['throughput (median)', 'wall time (mean)'] if timed else [])
    body = [row_cells(row, analysis.summaries[label], images, reach, timed) for label, row in rows.items()]
    notes = [f"- `{f.name}` failed ({f.why}): {f.tail}" for row in rows.values() for f in row.failed]
    return '\n'.join(markdown(head, body) + ([''] + notes if notes else [])) + '\n'


def row_cells(row, s, images, reach, timed):
    """A row's cells of the results table, s being its Summary."""
    n = len(row.results)
    cells = [f"`{row.label}`", f"{row.params:,}" if row.params else '-', f"{n}/{n + len(row.failed)}",
             shown(s.best, '{:.4f}'), shown(s.final, '{:.4f}')]
    if images:
        cells += [shown(s.top1, '{:.2f}'), shown(s.top5, '{:.2f}')]
    cells.append(shown_diff(s.diff))
    if reach:
        cells.append(', '.join('not reached' if it is None else str(it) for it in s.reached) or '-')
    if timed:
        cells += [f"{s.rate:,.0f} {s.unit}/s" if s.rate else '-', f"{s.wall:.0f} s" if s.wall is not None else '-']
    return cells


def tuning_table(losses, picked):
    """Each tuning run's final val loss ({label: loss}), the chosen setting of each case (picked) in bold."""
    body = []
    for label, loss in losses.items():
        cell = f"{loss:.4f}" if math.isfinite(loss) else 'failed or not finite'
        body.append([f"`{label}`", f"**{cell}**" if label in picked else cell])
    return '\n'.join(markdown([f'tuning run (seed {TUNING_SEED})', 'final val loss'], body)) + '\n'


def speedup_table(rows, analysis, timed):
    """The nGPT paper's protocol (module docstring): the steps (and time) at which each case's mean
    final val loss reaches the baseline's at the longest length."""
    lengths, name = analysis.lengths, analysis.baseline
    longest = lengths[-1]
    head = ['method', 'parameters'] + [f"final val loss, {n} steps" for n in lengths] + \
        [f'baseline at {longest}', 'steps to it', 'speedup in steps'] + \
        (['ms/iter', 'time to it', 'speedup in time'] if timed else [])
    whose = " (at the row's --set values)" if ' ' not in name and any(row.case.set for row in rows.values()) else ''
    body = []
    for s in analysis.speedups:
        steps = {'<=': f"≤ {s.steps:.0f}", '=': f"{s.steps:.0f}", '>': f"> {s.steps:.0f} (not reached)"}[s.how]
        cells = [f"`{s.case}`", f"{s.params:,}" if s.params else '-',
                 *(shown(s.finals.get(n), '{:.4f}') for n in lengths), f"{s.target:.4f}", steps, '-' if s.in_steps is None else f"{s.in_steps:.2f}x"]
        if timed:
            cells += [f"{s.ms:.1f}" if s.ms else '-', '-' if s.time is None else f"{s.time:.0f} s",
                      '-' if s.in_time is None else f"{s.in_time:.2f}x"]
        body.append(cells)
    return '\n'.join([f"Target of each row: the final val loss of `{name}`{whose} at {longest} steps, mean over seeds.",
                      '', *markdown(head, body)]) + '\n'


def report(args, command, rows, analysis, tuning, picked):
    """results.md: the command, the tuning table, what the runs' protocol and timing were, the
    results table and, with two --lengths or more, the speedup table."""
    timed = args.nproc == 1
    protocol = '' if not args.switch else (
        f"Second phases continue their first phase's checkpoint from iteration {args.switch_at} "
        + ("with a fresh optimizer and learning-rate schedule.\n\n" if args.switch_reset
           else "with its optimizer state and learning-rate schedule.\n\n"))
    reach = '' if not args.reach else (
        f"The reach column: the first evaluation at which each seed's val loss is at most "
        f"{analysis.target:.4f} (`{args.reach}`).\n\n")
    untimed = '' if timed else f"The {args.nproc} runs at a time shared the machine: nothing is timed.\n\n"
    return (f"`{command}`\n\n" + (tuning_table(tuning, picked) + '\n' if tuning else '') + protocol + reach + untimed
            + table(rows, analysis, bool(args.reach), timed)
            + ('\n' + speedup_table(rows, analysis, timed) if analysis.speedups is not None else ''))

# ----------------------------------------------------------------------------- 7. the command


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
    p.add_argument('--progress', type=float, default=progress.EVERY, metavar='SECONDS',
                   help='seconds between progress lines: the runs done, the running ones\' iterations, the time left '
                        '(0: none)')
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
    """main()'s comparison, its --out held: the runs, results.md and curves.png; the rows."""
    chosen, tuning = tune(args, extra) if args.tune else (cases(args), {})
    runs = plan(args, extra, chosen, SEEDS[:args.seeds], args.lengths or (None,))
    execute(runs, args.nproc, args.progress)
    rows = read_rows(runs)
    analysis = analyse(rows, args.baseline, args.reach, by_length=bool(args.lengths) and len(args.lengths) > 1)
    command = 'python tools/compare.py ' + shlex.join(sys.argv[1:] if argv is None else argv)
    text = report(args, command, rows, analysis, tuning, {c.label for c in chosen})
    files.write_text(os.path.join(args.out, 'results.md'), text)
    print(text)
    plots.curves({label: [r.log for r in row.results] for label, row in rows.items()},
                 os.path.join(args.out, 'curves.png'), args.switch_at)
    return rows


if __name__ == '__main__':
    main()
