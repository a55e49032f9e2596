"""How long a run will take on a CPU, from timed passes, before it starts; and the CPU recipe's
command when a config the user did not size for a CPU would take hours there."""

import contextlib
import os
import shlex
import statistics
import time

import torch

import configure
from orthogpt.errors import UserError
from orthogpt.optim import oom_advice
from orthogpt.parallel import maps_of, verdict

LIMIT = 3600  # seconds: a run that did not ask for the CPU stops before training past this
FAR = 10  # x LIMIT: a first pass, a warm-up slower than the next ones, that far past it stops the run at once
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def format_time(seconds):
    """H:MM:SS, as the log lines' ETA."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def duration(seconds):
    """A span in words: '4 s', '3 min 05 s', '2 h 13 min'."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{max(seconds, 1)} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds // 60 % 60:02d} min"


@contextlib.contextmanager
def untouched(model):
    """Passes inside change no weight, gradient, random state or data position that training will see."""
    rng = torch.get_rng_state()
    try:
        yield
    finally:
        model.train()
        model.zero_grad(set_to_none=True)
        torch.set_rng_state(rng)


def one_pass(model, batch, env, train, n):
    """Seconds of a training micro-step's forward and backward (train) or of an evaluation batch's forward, on the
    first n items of the batch, scaled up to the batch."""
    x, y = batch
    model.train(train)
    t0 = time.perf_counter()
    with torch.set_grad_enabled(train), maps_of(model, env, grad=train), env.autocast:
        _, loss = model(x[:n], y[:n])
    if train:
        loss.backward()
    return (time.perf_counter() - t0) * len(x) / n


def quarter(batch):  # the items of a quarter of the batch, rounded up
    return -(-len(batch[0]) // 4)


def first_passes(model, batch, env):
    """(training pass, evaluation batch) in seconds, each the first of its kind, on a quarter of the batch: slower
    than the next ones (a rough upper bound), and the warm-up of time_passes, which they size."""
    with untouched(model):
        return tuple(one_pass(model, batch, env, train, quarter(batch)) for train in (True, False))


def time_passes(model, batch, env, first, repeats=3):
    """([training passes], [evaluation batches]) in seconds, `repeats` timings of each after first_passes, whose
    training pass took `first` seconds: where that was over a second, quarters of the batch are timed and scaled up,
    else whole batches."""
    n = len(batch[0]) if first < 1 else quarter(batch)
    with untouched(model):
        return tuple([one_pass(model, batch, env, train, n) for _ in range(repeats)] for train in (True, False))


def cpu_command(argv):
    """The command of argv with config/cpu.py stacked after its config files."""
    files, overrides = [a for a in argv if not a.startswith('--')], [a for a in argv if a.startswith('--')]
    cpu = os.path.join(ROOT, 'config', 'cpu.py')
    near = os.path.relpath(cpu)
    return shlex.join(['python', 'train.py', *files, cpu if near.startswith('..') else near, *overrides])


def busy(threads, processes=1):
    """A line naming a busy machine, or None: where the load average of the last minute leaves fewer
    free cores than the run's threads on this machine (threads per process x its processes here).
    Threads that wait for one another at every operation are slowed most by other jobs: on the busy
    2-core VM, 2 threads took 4-11x the ms/iter of 1 thread, 9-26x that of 2 DDP processes of one
    thread each (docs/performance.md, "Advice for CPU users")."""
    cores, load = os.cpu_count() or 1, os.getloadavg()[0]
    if cores - load >= threads * processes - 0.5:  # a core half used by others still serves
        return None
    advice = (f"one thread per process waits least under load: {FEWER}" if threads > 1 else
              "it runs one thread per process already, which waits least under load")
    return (f"note: this machine is busy: a load average of {load:.1f} on {cores} cores leaves about "
            f"{max(cores - load, 0):.1f} free for this run's {threads * processes} threads, so its steps may take "
            f"many times the estimate; {advice} (docs/performance.md, \"Advice for CPU users\")")


FEWER = "OMP_NUM_THREADS=1 before the command, or torchrun with a process per core"


def thread_share(processes):
    """Threads for each of `processes` processes that run at once on this machine: its cores split between them, as
    threads that wait for one another on a core another process holds take many times longer (busy)."""
    return max(1, (os.cpu_count() or 1) // processes)


def check_cpu_run(run, argv, iters, evals):
    """On a CPU: print how long `iters` iterations and `evals` evaluations of the Run will take. A
    run that did not ask for the CPU (device='auto' found no GPU) and would take over LIMIT stops
    here, before its first evaluation, with the command sized for a CPU: at once where its first
    passes put it past FAR x LIMIT (a GPU-sized config: hours), else after the timings. Rank 0
    times; every process learns the verdict."""
    cfg, env, task = run.cfg, run.env, run.task
    message = None
    if env.master:
        try:
            first = first_passes(run.raw_model, task.batch, env)
            total = run_times(run, [first[0]], [first[1]], iters, evals)
            if cfg.device != 'auto' or total[0] <= FAR * LIMIT:
                total = run_times(run, *time_passes(run.raw_model, task.batch, env, first[0]), iters, evals)
                print(f"on this CPU: about {duration(statistics.median(total))} ({duration(total[0])} to "
                      f"{duration(total[-1])} over {len(total)} timings of a training pass and an evaluation batch) "
                      f"for {iters} iterations and {evals} evaluations")
                hint = busy(torch.get_num_threads(), int(os.environ.get('LOCAL_WORLD_SIZE', 1)))
                if hint:
                    print(hint)
        except torch.OutOfMemoryError:
            raise UserError(oom_advice(cfg, True)) from None
        if cfg.device == 'auto' and total[0] > LIMIT:
            small = configure.load(shlex.split(cpu_command(argv))[2:])
            message = (f"this config is sized for a GPU ({cfg.n_layer} layers x {cfg.n_embd}, {task.items_per_iter:,} "
                       f"{task.unit} a step) and no GPU is here: on this CPU it would take about "
                       f"{duration(statistics.median(total))}. For a CPU, stack config/cpu.py (nanoGPT's CPU recipe: "
                       f"{small.n_layer} layers x {small.n_embd}, {small.max_iters} iterations):\n  {cpu_command(argv)}\n"
                       f"or run this config here anyway with --device=cpu")
    message = verdict(message, env.ddp)
    if message:
        raise UserError(message)


def run_times(run, train, evaluate, iters, evals):
    """Seconds of `iters` iterations and `evals` evaluations, a total for each pair of timings, shortest first."""
    micro_steps, batches = iters * run.micro_steps, evals * run.task.eval_batches(run.cfg.eval_iters)
    return [micro_steps * t + batches * e for t, e in zip(sorted(train), sorted(evaluate))]
