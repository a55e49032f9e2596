"""The two-block study's tables (docs/results.md, "Every rule in GPT-2's block and in the modern block"), from the
runs' logs kept beside this file (gpt2/, modern/: a folder per run, as compare.py names them: CONFIG-learning_rateLR-sS).

    python docs/logs/two_blocks/table.py                          # the tables, from the logs here
    python docs/logs/two_blocks/table.py --collect out-compare    # first copy in the finished runs of out-compare/

For each block and rule: the rate whose seed-1337 run ended lowest; the final val loss of seeds 1-3 at it (mean ± sample
std); its difference from additive in the same block, paired by seed (mean ± standard error); then the rank
correlation (Spearman's) of the two blocks' orderings of the rules, and modern additive against GPT-2-block additive.
"""

import argparse
import json
import math
import os
import re
import shutil
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCKS = {'gpt2': "GPT-2's block", 'modern': 'modern block'}
NAME = re.compile(r'(?P<config>.+)-learning_rate(?P<lr>[0-9.e+-]+?)-s(?P<seed>\d+)$')
TUNING_SEED = 1337


def final(folder):
    """(final val loss, parameters, value-embedding parameters) of a finished run, or None."""
    records = [json.loads(line) for line in open(os.path.join(folder, 'log.jsonl'))]
    cfg = json.load(open(os.path.join(folder, 'config.json')))
    evals = [r for r in records if 'val_loss' in r]
    start = next((r for r in records if r.get('event') == 'start'), {})
    if not evals or evals[-1]['iter'] != cfg['max_iters']:
        return None
    return evals[-1]['val_loss'], start.get('parameters'), start.get('value_embed_parameters', 0)


def runs(block):
    """{config: {(lr, seed): (loss, params, ve params)}} of the finished runs of a block."""
    found, root = {}, os.path.join(HERE, block)
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        m, done = NAME.match(name), final(os.path.join(root, name))
        if m and done:
            found.setdefault(m['config'], {})[(float(m['lr']), int(m['seed']))] = done
    return found


def summary(cells):
    """(chosen lr, {seed: loss}, params, ve params) of one rule in one block, or None before its tuning is done."""
    tuning = {lr: v[0] for (lr, seed), v in cells.items() if seed == TUNING_SEED}
    if len(tuning) < 3:  # the grid's three rates at least (compare.py may extend it)
        return None
    lr = min(tuning, key=tuning.get)
    seeds = {seed: v[0] for (r, seed), v in cells.items() if r == lr and seed != TUNING_SEED}
    _, params, ve = cells[(lr, TUNING_SEED)]
    return lr, seeds, params, ve


def paired(a, b):
    """(mean, standard error, n) of a[s] - b[s] over the seeds both hold."""
    d = [a[s] - b[s] for s in sorted(a.keys() & b.keys())]
    if len(d) < 2:
        return None
    return statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d)), len(d)


def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0.0] * len(values)
    for rank, i in enumerate(order):
        r[i] = float(rank)
    return r


def spearman(x, y):
    return statistics.correlation(ranks(x), ranks(y))


def fmt(p):
    return '' if p is None else f"{p[0]:+.4f} ± {p[1]:.4f} (n={p[2]})"


def table():
    data = {b: {c: summary(cells) for c, cells in runs(b).items()} for b in BLOCKS}
    configs = list(dict.fromkeys(c for b in BLOCKS for c in data[b]))
    base = {b: data[b].get('shakespeare_add') for b in BLOCKS}
    lines = ['| rule | ' + ' | '.join(f"{BLOCKS[b]}: rate, parameters, final val loss (seeds), Δ vs its additive"
                                      for b in BLOCKS) + ' |', '|---|' + '---|' * len(BLOCKS)]
    means = {}
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
            delta = '-' if c == 'shakespeare_add' or base[b] is None else fmt(paired(seeds, base[b][1]))
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
    return out


def collect(out):
    """Copy the finished runs' log.jsonl and config.json from out/blocks-<block>/ to <block>/ here."""
    for b in BLOCKS:
        src = os.path.join(out, f'blocks-{b}')
        for name in sorted(os.listdir(src)) if os.path.isdir(src) else []:
            if NAME.match(name) and os.path.exists(os.path.join(src, name, 'log.jsonl')) and final(
                    os.path.join(src, name)):
                os.makedirs(os.path.join(HERE, b, name), exist_ok=True)
                for f in ('log.jsonl', 'config.json'):
                    shutil.copyfile(os.path.join(src, name, f), os.path.join(HERE, b, name, f))


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--collect', metavar='OUT', help="copy in the finished runs of OUT/blocks-gpt2 and OUT/blocks-modern")
    args = p.parse_args()
    if args.collect:
        collect(args.collect)
    print(table())
