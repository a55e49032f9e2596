"""The two-block study's tables (docs/results.md, "Every rule in GPT-2's block and in the modern block"), from the
runs' logs kept beside this file (gpt2/, modern/: a folder per run, as compare.py names it: CONFIG-learning_rateLR-sS).

    python docs/logs/two_blocks/table.py                          # the tables, from the logs here
    python docs/logs/two_blocks/table.py --collect out-compare    # first copy in the finished runs of out-compare/

First the tuning runs: each rule's final val loss on seed 1337 at every rate run, the grid's extensions included. Then
for each block and rule: the chosen rate (compare.py's: the lowest seed-1337 loss, once no extension is pending); the
final val loss of seeds 1-3 at it (mean ± sample std); its difference from additive in the same block, paired by seed
(mean ± standard error) and what that says at 95% (a t interval on n-1 degrees of freedom: 'better' or 'worse' where
the interval excludes 0, 'unresolved' where it does not); then the rank correlation (Spearman's) of the two blocks'
orderings of the rules, modern additive against GPT-2-block additive, and for each rule with all three seeds in both
blocks whether its reading against additive survives the stronger baseline; last the differences seed by seed.
"""

import argparse
import json
import math
import os
import re
import shutil
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', '..', '..'))
from orthogpt.sweep import extend  # noqa: E402

BLOCKS = {'gpt2': "GPT-2's block", 'modern': 'modern block'}
NAME = re.compile(r'(?P<config>.+)-learning_rate(?P<lr>[0-9.e+-]+?)-s(?P<seed>\d+)$')
TUNING_SEED, GRID = 1337, ['1e-3', '2e-3', '4e-3']
CLAIM = {  # (against additive in GPT-2's block, in the modern block) -> the reading
    ('better', 'better'): 'survives', ('better', 'unresolved'): 'does not survive', ('better', 'worse'): 'reverses',
    ('unresolved', 'better'): 'appears in the modern block only', ('unresolved', 'unresolved'): 'none in either',
    ('unresolved', 'worse'): 'worse in the modern block only', ('worse', 'better'): 'reverses',
    ('worse', 'unresolved'): "worse in GPT-2's block only", ('worse', 'worse'): 'worse in both'}
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}  # two-sided 95% quantiles of Student's t, by d.o.f.


def final(folder):
    """(final val loss, parameters, value-embedding parameters) of a run that has ended, or None while it runs. As
    compare.py counts it (launcher.final_loss): inf for a run that ended without its last evaluation (diverged, say)
    or with a loss that is not finite."""
    records = [json.loads(line) for line in open(os.path.join(folder, 'log.jsonl'))]
    cfg = json.load(open(os.path.join(folder, 'config.json')))
    evals = [r for r in records if 'val_loss' in r]
    start = next((r for r in records if r.get('event') == 'start'), {})
    finished = evals and evals[-1]['iter'] == cfg['max_iters']
    if not finished and not os.path.exists(os.path.join(folder, 'run.json')):  # compare.py writes it as a run ends
        return None
    loss = evals[-1]['val_loss'] if finished and math.isfinite(evals[-1]['val_loss']) else math.inf
    return loss, start.get('parameters'), start.get('value_embed_parameters', 0)


def runs(block):
    """{config: {(lr, seed): (loss, params, ve params)}} of the finished runs of a block."""
    found, root = {}, os.path.join(HERE, block)
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        m, done = NAME.match(name), final(os.path.join(root, name))
        if m and done:
            found.setdefault(m['config'], {})[(float(m['lr']), int(m['seed']))] = done
    return found


def chosen(tuning, start=GRID):
    """compare.py's choice from {lr: seed-1337 loss}: the grid `start` is widened at its edge as sweep.tune widens it,
    and the best rate of the widened grid is the choice once every rate of it has run; None while one has not."""
    grid, added = list(start), {}
    while True:
        if any(float(v) not in tuning for v in grid):
            return None
        best = min(grid, key=lambda v: tuning[float(v)])
        wider = extend(grid, best, added, 'lr')
        if wider == grid:
            return float(best)
        grid = wider


def summary(cells, grid=GRID):
    """(chosen lr, {seed: loss}, params, ve params) of one rule in one block, or None before its tuning is done."""
    lr = chosen({lr: v[0] for (lr, seed), v in cells.items() if seed == TUNING_SEED}, grid)
    if lr is None:
        return None
    seeds = {seed: v[0] for (r, seed), v in cells.items() if r == lr and seed != TUNING_SEED}
    _, params, ve = cells[(lr, TUNING_SEED)]
    return lr, seeds, params, ve


def paired(a, b):
    """(mean, standard error, n) of a[s] - b[s] over the seeds both hold; None under two."""
    d = [a[s] - b[s] for s in sorted(a.keys() & b.keys())]
    if len(d) < 2:
        return None
    return statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d)), len(d)


def verdict(p):
    """'better', 'worse' or 'unresolved': whether the 95% t interval of a paired difference excludes 0."""
    mean, se, n = p
    half = T95[n - 1] * se
    return 'better' if mean + half < 0 else 'worse' if mean - half > 0 else 'unresolved'


def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0.0] * len(values)
    for rank, i in enumerate(order):
        r[i] = float(rank)
    return r


def spearman(x, y):
    return statistics.correlation(ranks(x), ranks(y))


def fmt(p):
    return 'no seed pair yet' if p is None else f"{p[0]:+.4f} ± {p[1]:.4f} (n={p[2]}, {verdict(p)})"


def tuning_table(found):
    """The seed-1337 losses at every rate run, a row per rule, the rates of both blocks as columns."""
    rates = sorted({lr for b in BLOCKS for cells in found[b].values() for lr, s in cells if s == TUNING_SEED})
    lines = ['| rule | ' + ' | '.join(f"{BLOCKS[b]}: " + ', '.join(f"{lr:g}" for lr in rates) for b in BLOCKS) + ' |',
             '|---|' + '---|' * len(BLOCKS)]
    for c in dict.fromkeys(c for b in BLOCKS for c in found[b]):
        cells = [', '.join(f"{found[b][c][(lr, TUNING_SEED)][0]:.4f}" if (lr, TUNING_SEED) in found[b].get(c, {})
                           else '-' for lr in rates) for b in BLOCKS]
        lines.append(f"| `{c}` | " + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def table(found):
    data = {b: {c: summary(cells) for c, cells in found[b].items()} for b in BLOCKS}
    configs = list(dict.fromkeys(c for b in BLOCKS for c in data[b]))
    base = {b: data[b].get('shakespeare_add') for b in BLOCKS}
    lines = ['| rule | ' + ' | '.join(f"{BLOCKS[b]}: rate, parameters, final val loss (seeds), Δ vs its additive"
                                      for b in BLOCKS) + ' |', '|---|' + '---|' * len(BLOCKS)]
    means, verdicts = {}, {}
    for c in configs:
        cells = []
        for b in BLOCKS:
            s = data[b].get(c)
            if s is None:
                cells.append('not yet tuned')
                continue
            lr, seeds, params, ve = s
            loss = (f"{statistics.mean(seeds.values()):.4f} ± {statistics.stdev(seeds.values()):.4f} "
                    f"({len(seeds)}/3)") if len(seeds) >= 2 else f"{len(seeds)}/3 seeds"
            if len(seeds) == 3:
                means.setdefault(c, {})[b] = statistics.mean(seeds.values())
            pair = None if c == 'shakespeare_add' or base[b] is None else paired(seeds, base[b][1])
            delta = '-' if c == 'shakespeare_add' else fmt(pair)
            if pair and pair[2] == 3:
                verdicts.setdefault(c, {})[b] = verdict(pair)
            count = f"{params:,}" + (f" ({ve:,} value emb.)" if ve else '')
            cells.append(f"{lr:g}, {count}, {loss}, {delta}")
        lines.append(f"| `{c}` | " + ' | '.join(cells) + ' |')
    both = [c for c in configs if len(means.get(c, {})) == 2]
    out = '\n'.join(lines)
    if len(both) >= 3:
        out += (f"\n\nSpearman's rank correlation of the two orderings ({len(both)} rules with 3 seeds in both): "
                f"{spearman([means[c]['gpt2'] for c in both], [means[c]['modern'] for c in both]):+.3f}")
    if all(base.values()):
        out += f"\n\nmodern additive - GPT-2-block additive, paired: {fmt(paired(base['modern'][1], base['gpt2'][1]))}"
    claims = [c for c in configs if len(verdicts.get(c, {})) == 2]
    if claims:
        out += ("\n\n| rule | against additive, GPT-2's block | in the modern block | the claim |\n|---|---|---|---|\n"
                + '\n'.join(f"| `{c}` | {verdicts[c]['gpt2']} | {verdicts[c]['modern']} | "
                            f"{CLAIM[tuple(verdicts[c][b] for b in BLOCKS)]} |" for c in claims))
    return out


def per_seed(found):
    """Each rule's difference from additive in its block, seed by seed, and modern additive's from GPT-2-block
    additive's: the signs behind the means."""
    data = {b: {c: summary(cells) for c, cells in found[b].items()} for b in BLOCKS}
    base = {b: data[b].get('shakespeare_add') for b in BLOCKS}
    if not all(base.values()):
        return ''

    def diffs(a, b):
        return ', '.join(f"{a[s] - b[s]:+.3f}" for s in sorted(a.keys() & b.keys())) or '-'
    lines = ['| rule − additive, seeds 1, 2, 3 | ' + ' | '.join(BLOCKS.values()) + ' |', '|---|' + '---|' * len(BLOCKS)]
    for c in dict.fromkeys(c for b in BLOCKS for c in data[b] if c != 'shakespeare_add'):
        lines.append(f"| `{c}` | " + ' | '.join(diffs(data[b][c][1], base[b][1]) if data[b].get(c) else '-'
                                                for b in BLOCKS) + ' |')
    return ('\n'.join(lines) + f"\n\nmodern additive − GPT-2-block additive, seeds 1, 2, 3: "
            f"{diffs(base['modern'][1], base['gpt2'][1])}")


def collect(out):
    """Copy the ended runs' log.jsonl, config.json and run.json from out/blocks-<block>/ to <block>/ here."""
    for b in BLOCKS:
        src = os.path.join(out, f'blocks-{b}')
        for name in sorted(os.listdir(src)) if os.path.isdir(src) else []:
            if NAME.match(name) and os.path.exists(os.path.join(src, name, 'log.jsonl')) and final(
                    os.path.join(src, name)):
                os.makedirs(os.path.join(HERE, b, name), exist_ok=True)
                for f in ('log.jsonl', 'config.json', 'run.json'):
                    if os.path.exists(os.path.join(src, name, f)):
                        shutil.copyfile(os.path.join(src, name, f), os.path.join(HERE, b, name, f))


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--collect', metavar='OUT', help="copy in the ended runs of OUT/blocks-gpt2 and OUT/blocks-modern")
    args = p.parse_args()
    if args.collect:
        collect(args.collect)
    found = {b: runs(b) for b in BLOCKS}
    print('Tuning, seed 1337 (final val loss at each rate; -: not run):\n')
    print(tuning_table(found))
    print('\nSeeds 1-3 at the chosen rate:\n')
    print(table(found))
    seeds = per_seed(found)
    if seeds:
        print('\nThe differences seed by seed:\n')
        print(seeds)
