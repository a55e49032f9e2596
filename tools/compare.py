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

Compiling: --compile=auto (the default) measures whether it pays (orthogpt/compile_choice.py). Each
model of the comparison (runs that differ only in seed, rates, length or logging share one) trains
--probe_iters iterations (40) eager and compiled in OUT/probes/, --nproc at a time as the runs do;
from their steady ms/iter and their wall times, compiling's one-off cost over what it saves a step
is the break-even, and a run compiles where it has more iterations left than that (a resume pays
the compile again). OUT/compile.md tables the probes (results.md ends with it), and each run's
config.json holds its choice. It overrides a config file's compile (config/cpu.py's False is for a
run alone), but not a --set, --per or --tune of compile. Models whose runs all have fewer iterations
left than 10 probes are not probed, nor runs under --launcher=slurm (this machine's times are not a
node's): they run as their configs say. A probe that failed is kept and named; where the compiled
one failed, the runs run eager. --compile=True or False sets every run instead. A finished run is
kept whichever way it ran. Times in the table then mix eager and compiled runs, as compile.md says.

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

This is a command line of orthogpt/sweep.py, the engine that tools/miniseries.py runs too.
"""

import argparse
import os
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)
from orthogpt import errors, launcher, progress, sweep  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402
from orthogpt.planning import SEEDS  # noqa: E402


def parse_args(argv):
    """argv as a sweep.Spec; a UserError for options that do not go together."""
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
    sweep.add_launcher_options(p)
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
    if args.switch and args.launcher == 'slurm':
        raise UserError("--switch runs with the local launcher only: a second phase starts from a copy of its first "
                        "phase's checkpoint, which Slurm's jobs do not wait for")
    if args.switch and (args.lengths or args.tune):
        raise UserError("--switch goes with neither --lengths nor --tune: tune the first phase's setting first, "
                        "then compare the switches at it")
    args.sbatch = shlex.split(args.sbatch)
    return sweep.Spec(**vars(args), extra=extra)


@errors.entry
def main(argv=None):
    """The comparison (orthogpt/sweep.py); its rows."""
    spec = parse_args(argv)
    try:
        return sweep.compare(spec, 'python tools/compare.py ' + shlex.join(sys.argv[1:] if argv is None else argv))
    except launcher.Stopped:  # the runs have saved their checkpoints, or go on as Slurm jobs
        raise SystemExit("interrupted; the same command resumes the unfinished runs, or waits for their jobs") from None


if __name__ == '__main__':
    main()
