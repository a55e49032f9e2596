"""The width-128 CPU step of HC and mHC before the rules were restructured for the fused kernels (commit 454b3bf) and
in this tree, interleaved (docs/performance.md, "On a CPU: the rules' own PyTorch, before and after"): bench.py
processes alternate between the two trees, A B A B ..., each timing --repeats rounds of 20 compiled steps of additive,
hc and mhc at the CPU recipe; then each tree's median ms/iter over all its rounds, and the median over alternations of
the after/before ratio of the two processes next to each other (paired, so that a drift of the machine cancels).

    python docs/logs/kernels_cpu/interleaved.py --pairs=3 --out=docs/logs/kernels_cpu/interleaved.txt

Run it on an idle machine: it times. Each process compiles first (a minute or more on 2 cores), untimed.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..'))
BEFORE = '454b3bf'
VARIANTS = ('additive', 'hc', 'mhc')


def bench(tree, data, repeats, extra):
    """{variant: median ms/iter} of one bench.py process in `tree`."""
    argv = [sys.executable, 'tools/bench.py', 'config/shakespeare_add.py', 'config/cpu.py', f'--data_dir={data}',
            f'--repeats={repeats}', '--compile', f"--variants={','.join(VARIANTS)}", *extra]
    out = subprocess.run(argv, cwd=tree, capture_output=True, text=True, check=True).stdout
    rows = {line.split('|')[1].strip(): line.split('|') for line in out.splitlines() if line.startswith('| ')}
    return {v: float(rows[v][3].split()[0]) for v in VARIANTS}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--pairs', type=int, default=3, help='alternations: a process of each tree per pair')
    p.add_argument('--repeats', type=int, default=3, help="bench.py's timed rounds per process")
    p.add_argument('--data', default=os.path.join(ROOT, 'data', 'shakespeare_char'), help='prepared Tiny Shakespeare')
    p.add_argument('--out', default=None, help='also write the report here')
    args, extra = p.parse_known_args()
    before = os.path.join(tempfile.mkdtemp(), 'before')
    subprocess.run(['git', 'worktree', 'add', '--detach', before, BEFORE], cwd=ROOT, check=True, capture_output=True)
    lines = [f"interleaved: {BEFORE} (before) and {subprocess.check_output(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, text=True).strip()} (after), "
             f"{args.pairs} pairs of processes, {args.repeats} rounds of 20 compiled steps each; extra {extra}"]
    try:
        runs = []
        for i in range(args.pairs):
            pair = {name: bench(tree, args.data, args.repeats, extra) for name, tree in (('before', before), ('after', ROOT))}
            runs.append(pair)
            lines.append(f"pair {i + 1}: " + '; '.join(f"{name} " + ', '.join(f"{v} {ms:.1f}" for v, ms in t.items())
                                                       for name, t in pair.items()))
    finally:
        subprocess.run(['git', 'worktree', 'remove', '--force', before], cwd=ROOT, check=False)
    lines.append('| variant | before, median ms | after, median ms | after / before, median of pairs |')
    lines.append('|---|---|---|---|')
    for v in VARIANTS:
        b, a = ([r[name][v] for r in runs] for name in ('before', 'after'))
        ratio = statistics.median(x / y for x, y in zip(a, b))
        lines.append(f"| {v} | {statistics.median(b):.1f} | {statistics.median(a):.1f} | {ratio:.3f} |")
    report = '\n'.join(lines)
    print(report)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(report + '\n')


if __name__ == '__main__':
    main()
