"""A plan's runs as train.py processes: the unfinished ones started (or resumed from their
checkpoints), nproc at a time, while a watcher prints their progress, and each one's exit status
and wall time kept beside it in run.json; a finished run is kept, not run again, where its folder
holds a run of its config. Ctrl-C and SIGTERM stop the runs at their next step with a checkpoint,
and so does the end of the process that launched them, by SIGKILL too (on Linux): a comparison
stopped any way resumes with the same command."""

import filecmp
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import torch

from orthogpt import files, logs, progress, signals
from orthogpt.errors import UserError
from orthogpt.estimate import duration, thread_share
from orthogpt.planning import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: train.py


class Stopped(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the runs, which have saved their checkpoints: the same command resumes
    them."""


@dataclass
class Job:
    """A run's train.py while it runs."""
    run: object  # planning.Run
    proc: subprocess.Popen
    stdout: object  # the run's stdout.log, open
    t0: float


@dataclass
class Status:
    """What a run's last process left: run.json (written when it ended) and the last 3 lines it
    printed. None where no comparison ever ran it (or train.py ran it by itself)."""
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


def finished(run):
    return any(r['iter'] == run.cfg.max_iters and 'val_loss' in r for r in logs.read(run.out_dir))


def final_loss(run):
    """A finished run's final val loss; inf for one that failed (diverged, say)."""
    evals = logs.evaluations(logs.read(run.out_dir))
    return evals[-1][1] if finished(run) and math.isfinite(evals[-1][1]) else math.inf


def execute(runs, nproc, watch):
    """Runs the unfinished runs, nproc at a time, watch.tick(todo, running) between looks at them (a
    Progress line, say); records each one's exit status and wall time. Ctrl-C (which a terminal
    sends the runs too) or SIGTERM (passed on to them here) raises Stopped once they have saved."""
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

    # SIGINT raises here even where it came ignored (a job started with `&` by a script, nohup): the runs take it as
    # their request to save and stop whatever they inherit (orthogpt/signals.py), and no new run may start after it
    handlers = {signal.SIGTERM: terminate, signal.SIGINT: signal.default_int_handler}
    before = {s: signal.signal(s, h) for s, h in handlers.items()}
    try:
        launch(todo, running, nproc, env, torch.cuda.device_count(), watch)
    except KeyboardInterrupt:  # let the runs save their checkpoints
        for job in running:
            job.proc.wait()
        raise Stopped from None
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


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
    for out_dir (a folder may hold a run that another comparison trained with the same config: a link)
    and compile (--compile=auto chooses by the iterations a run has left)."""
    before = Status.read(run).argv
    if before is None:  # never run by a comparison
        return {}
    ours, theirs = asdict(run.cfg), asdict(load(before, run.name))
    return {k: (ours[k], theirs[k]) for k in ours if k not in ('out_dir', 'compile') and ours[k] != theirs[k]}


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


def launch(todo, running, nproc, env, gpus, watch):
    """Keeps nproc runs going (Jobs in running) until every run in todo has ended, watched; a second
    phase waits until its first has exited and is dropped (reported as not run) when that one did
    not finish."""
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
        watch.tick(todo, running)


def spawn(run, env):
    """Starts run's train.py, its output appended to its stdout.log."""
    argv, resuming = start(run)
    out = open(os.path.join(run.out_dir, 'stdout.log'), 'a')
    # if the launcher dies (SIGKILL included), its runs get SIGTERM: they save and stop
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
