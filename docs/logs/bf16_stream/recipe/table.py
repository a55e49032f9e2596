"""The bfloat16 stream's effect on the loss at the CPU recipe, from the logs beside this file: for each rule and
seed, the final val loss (iteration 2000) with the stream's copies in float32 (the tree before, commit 454b3bf) and
in bfloat16 (after), both under bfloat16 autocast; the mean +- std over seeds, the paired difference with its
standard error, and the largest gap between the two trees' val losses at any evaluation.

    python docs/logs/bf16_stream/recipe/table.py
"""
import pathlib
import re
import statistics

HERE = pathlib.Path(__file__).parent


def val_losses(path):
    return [float(v) for v in re.findall(r'^step \d+: .*val loss (\d+\.\d+)', path.read_text(), re.M)]


print('| rule | seed | val loss, float32 copies | bfloat16 copies | difference | largest gap at an evaluation |\n'
      '|---|---|---|---|---|---|')
for rule in ('mhc', 'hc'):
    seeds = sorted(int(p.stem.split('s')[-1]) for p in HERE.glob(f'{rule}-after-s*.txt'))
    before, after = ([val_losses(HERE / f'{rule}-{tree}-s{s}.txt') for s in seeds] for tree in ('before', 'after'))
    for s, b, a in zip(seeds, before, after):
        assert len(a) == len(b), f"{rule} seed {s}: the runs evaluated {len(b)} and {len(a)} times"
        print(f"| {rule} | {s} | {b[-1]:.4f} | {a[-1]:.4f} | {a[-1] - b[-1]:+.4f} | "
              f"{max(abs(x - y) for x, y in zip(a, b)):.4f} |")
    if len(seeds) > 1:
        fb, fa = [b[-1] for b in before], [a[-1] for a in after]
        d = [y - x for x, y in zip(fb, fa)]
        print(f"| {rule} | mean +- std | {statistics.mean(fb):.4f} +- {statistics.stdev(fb):.4f} | "
              f"{statistics.mean(fa):.4f} +- {statistics.stdev(fa):.4f} | "
              f"{statistics.mean(d):+.4f} +- {statistics.stdev(d) / len(d) ** 0.5:.4f} (SE) | |")
