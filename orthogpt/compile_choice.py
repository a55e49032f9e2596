"""Whether a comparison's runs compile (tools/compare.py and tools/miniseries.py, --compile=auto):
measured on the machine that runs them, not assumed.

Each distinct model and step among the runs (their configs but for the keys in FREE, which change
neither) is trained twice for --probe_iters iterations in OUT/probes/, eager and compiled (as its
compile_scope says), --nproc at a time as the runs will be, so that each sees the threads a run
sees. From the two: e and c, the median ms/iter of the log windows after the first (steady steps);
K, the compiled probe's wall time less the eager one's less probe_iters x (c - e): what compiling
costs a process once (its traces, evaluation's included, and inductor's code generation, warm
wherever inductor's cache already holds the graphs). A run compiles where the iterations it has
left outnumber K / (e - c), the break-even: every start and every resume pays K again. A run whose
command line sets compile (--set, --per, --tune) keeps it. A group whose runs all have fewer than
MIN_PROBES probes' iterations left is not probed and runs as its config says, and so is one whose
eager probe failed; where the compiled one failed, its runs run eager (the failed probe is kept and
named). OUT/compile.md tables the probes; each run's config.json records its choice."""

import hashlib
import os
import shutil
import statistics
from dataclasses import asdict, replace

from orthogpt import files, logs
from orthogpt.launcher import Status, finished, iterations
from orthogpt.planning import Run, load

# keys that change neither the model nor the cost of a step: runs that differ only in these share a probe
FREE = {'seed', 'out_dir', 'init_from', 'max_iters', 'lr_decay_iters', 'learning_rate', 'min_lr_ratio', 'warmup_iters',
        'decay_lr', 'weight_decay', 'muon_lr', 'muon_weight_decay', 'muon_momentum', 'muon_momentum_warmup', 'beta1',
        'beta2', 'grad_clip', 'init', 'sigma_w', 'sigma_qk', 'eval_interval', 'log_interval', 'compile', 'keep_last_n',
        'async_save', 'nan_policy', 'nan_max_skips', 'dist_timeout', 'wandb_log', 'wandb_project', 'wandb_run_name',
        'dynamics_interval', 'dynamics_gain_interval', 'tokens_per_param'}
MIN_PROBES = 10  # a probe pair costs about two probes' iterations of a run, plus one compile


def choose(runs, probe_iters, out, run_all):
    """Sets the compile of each unfinished run whose command line leaves it open (its argv and cfg)
    where a probe says which pays; run_all(probes) runs the probes. Writes OUT/compile.md; returns
    its rows."""
    todo = [r for r in runs if not finished(r) and not any(a.startswith('--compile=') for a in r.argv)]
    groups = {}
    for run in todo:
        groups.setdefault(key_of(run.cfg), []).append(run)
    probes = {k: pair(g[0], k, probe_iters, out) for k, g in groups.items()
              if max(left(r) for r in g) >= MIN_PROBES * probe_iters}
    run_all([p for pr in probes.values() for p in pr if not finished(p) and not Status.read(p).returncode])
    rows = []
    for k, (eager, compiled) in probes.items():
        measured = measure(eager, compiled, probe_iters)
        if measured is None:
            failed = [p for p in (eager, compiled) if not finished(p)]
            for p in failed:
                print(f"compile=auto: the probe {p.out_dir} failed ({Status.read(p).tail}); remove its folder to "
                      f"probe again")
            if failed == [compiled]:  # the model does not compile here: its runs do not try
                for run in groups[k]:
                    set_compile(run, False)
            continue
        e, c, cost = measured
        even = cost / (e - c) if e > c else float('inf')
        chosen = [r for r in groups[k] if left(r) > even]
        for run in groups[k]:
            set_compile(run, run in chosen)
        rows.append((compiled.name.removesuffix('-compiled'), e, c, cost, even, len(chosen), len(groups[k])))
    if rows:
        text = table(rows, probe_iters)
        files.write_text(os.path.join(out, 'compile.md'), text)
        print(text)
    return rows


def key_of(cfg):
    return tuple(sorted((k, repr(v)) for k, v in asdict(cfg).items() if k not in FREE))


def left(run):
    reached, first, last = iterations(run)
    return last - max(reached, first)


def pair(run, key, probe_iters, out):
    """The two probes of run's group, eager and compiled, named by its config and its model's key (so
    that the tuning runs and the reported ones share them); a folder left by a probe that was
    stopped is emptied, so that a probe's wall time is one process's (one that failed is kept)."""
    made = []
    stem = f"{run.case.name}-{hashlib.sha1(repr(key).encode()).hexdigest()[:8]}"
    for name, flag in (('eager', False), ('compiled', True)):
        folder = os.path.join(out, 'probes', f'{stem}-{name}')
        argv = [*run.argv, f'--max_iters={probe_iters}', f'--eval_interval={probe_iters}',
                f'--log_interval={max(1, probe_iters // 4)}', '--dynamics=False', '--wandb_log=False', f'--compile={flag}',
                f'--out_dir={folder}']
        probe = Run(f'{stem}-{name}', run.seed, argv, folder, load(argv, f'{stem}-{name}'), run.case, None)
        if not finished(probe) and not Status.read(probe).returncode:
            shutil.rmtree(folder, ignore_errors=True)
        made.append(probe)
    return made


def measure(eager, compiled, probe_iters):
    """(e, c: steady seconds per iteration, K: compiling's cost in seconds), or None where a probe
    did not finish."""
    if not (finished(eager) and finished(compiled)):
        return None
    e, c = steady(eager), steady(compiled)
    cost = Status.read(compiled).wall_s - Status.read(eager).wall_s - probe_iters * (c - e)
    return e, c, cost


def steady(probe):
    windows = [r['ms_per_iter'] for r in logs.read(probe.out_dir) if 'ms_per_iter' in r]
    return statistics.median_high(windows[1:]) / 1e3


def set_compile(run, flag):
    run.argv.append(f'--compile={flag}')  # choose() passes only runs whose argv leaves compile open
    run.cfg = replace(run.cfg, compile=flag)


def table(rows, probe_iters):
    lines = [f"compile=auto: each model's probes ({probe_iters} iterations eager and compiled, OUT/probes/); a run "
             "compiles where it has more iterations left than the break-even", '',
             '| probe | eager, ms/iter | compiled, ms/iter | compiling, s | break-even, iterations | runs compiled |',
             '|---|---|---|---|---|---|']
    for name, e, c, cost, even, n, of in rows:
        lines.append(f"| {name} | {e * 1e3:.1f} | {c * 1e3:.1f} | {cost:.1f} | "
                     f"{'never' if even == float('inf') else f'{even:,.0f}'} | {n} of {of} |")
    return '\n'.join(lines) + '\n'
