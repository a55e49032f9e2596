"""The tables of "Every rule at 16 layers, rates tuned there" (docs/results.md), from the runs' logs kept beside this
file: a folder per cell, named block-optimizer-depth (gpt2-adamw-16/, modern-adamw-16/, modern-muon-16/), a folder
per run in it as compare.py names it (CONFIG-n_layer16-learning_rateLR-sS). The 4-layer cells are the two-block
study's (docs/logs/two_blocks/: width 128, as config/cpu.py; the 16-layer cells are width 64, as the depth ladder).

    python docs/logs/depth16/table.py                                  # the tables, from the logs here
    python docs/logs/depth16/table.py --collect out-compare/depth16    # first copy in the ended runs of OUT/CELL/
    python docs/logs/depth16/table.py --muon                           # the Muon cell's configs and rates (run.sh)
    python docs/logs/depth16/table.py --figure docs/depth16_deltas.png  # the paired differences, drawn

The rules of reading are the two-block study's (its table.py, whose functions these tables call): a rate is chosen
as compare.py chooses it (the lowest seed-1337 loss once the grid's extensions have run); a rule's difference from
additive in its cell is paired by seed (mean ± standard error), and 'better' or 'worse' where the 95% t interval on
n-1 degrees of freedom excludes 0, else 'unresolved'.
"""

import argparse
import importlib.util
import math
import os
import re
import shutil
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location('two_blocks', os.path.join(HERE, '..', 'two_blocks', 'table.py'))
two = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(two)

CELLS = {  # (block, optimizer, layers): its folder
    ('gpt2', 'adamw', 4): os.path.join(HERE, '..', 'two_blocks', 'gpt2'),
    ('gpt2', 'adamw', 16): os.path.join(HERE, 'gpt2-adamw-16'),
    ('modern', 'adamw', 4): os.path.join(HERE, '..', 'two_blocks', 'modern'),
    ('modern', 'adamw', 16): os.path.join(HERE, 'modern-adamw-16'),
    ('modern', 'muon', 16): os.path.join(HERE, 'modern-muon-16'),
}
RATE = {'adamw': 'learning_rate', 'muon': 'muon_lr'}
GRID = {'adamw': two.GRID, 'muon': ['0.005', '0.01', '0.02']}  # run.sh's --tune, before compare.py widens it
RULES = ['add', 'ortho', 'rot', 'hc', 'mhc', 'ddl', 'attnres', 'denseformer']


def cell_runs(cell):
    """{rule: {(rate, seed): (loss, params, ve params)}} of a cell's ended runs."""
    pattern = re.compile(rf"shakespeare_(?P<rule>[a-z0-9]+)-.*?{RATE[cell[1]]}(?P<lr>[0-9.e+-]+?)-s(?P<seed>\d+)$")
    found, root = {}, CELLS[cell]
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        m = pattern.match(name)
        done = m and m['rule'] in RULES and two.final(os.path.join(root, name))
        if done:
            found.setdefault(m['rule'], {})[(float(m['lr']), int(m['seed']))] = done
    return found


def summaries():
    """{cell: {rule: (chosen rate, {seed: loss}, params, ve params)}} for the rules tuned so far."""
    return {cell: {r: s for r, runs in cell_runs(cell).items() for s in [two.summary(runs, GRID[cell[1]])] if s}
            for cell in CELLS}


def deltas(data):
    """{cell: {rule: (mean, se, n) of rule - additive, paired by seed}} where two seeds pair or more."""
    out = {}
    for cell, rules in data.items():
        base = rules.get('add')
        for r, (_, seeds, _, _) in rules.items():
            p = base and r != 'add' and two.paired(seeds, base[1])
            if p:
                out.setdefault(cell, {})[r] = p
    return out


def name(cell):
    block, opt, layers = cell
    return f"{'GPT-2' if block == 'gpt2' else 'modern'}, {opt}, {layers}"


def tuning_table():
    """Each 16-layer cell's seed-1337 losses by rate, the grid's extensions included."""
    lines = []
    for cell in [c for c in CELLS if c[2] == 16]:
        found = cell_runs(cell)
        rates = sorted({lr for runs in found.values() for lr, s in runs if s == two.TUNING_SEED})
        if not rates:
            continue
        lines += [f"\n{name(cell)} ({RATE[cell[1]]}, seed 1337):\n", '| rule | ' + ' | '.join(f'{r:g}' for r in rates)
                  + ' |', '|---|' + '---|' * len(rates)]
        for r in [r for r in RULES if r in found]:
            runs = found[r]
            lines.append(f"| {r} | " + ' | '.join(f"{runs[(lr, two.TUNING_SEED)][0]:.4f}" if (lr, two.TUNING_SEED) in runs
                                                 else '-' for lr in rates) + ' |')
    return '\n'.join(lines)


def spread(seeds):
    """mean ± std of {seed: loss}, or '-' under two seeds."""
    return f"{statistics.mean(seeds.values()):.4f} ± {statistics.stdev(seeds.values()):.4f}" if len(seeds) > 1 else '-'


def main_table(data, d):
    """Per rule and cell: the chosen rate, parameters, final val loss over the seeds, and the paired difference."""
    lines = ['| rule | cell | rate | parameters | seeds | final val loss | Δ vs additive (n, at 95%) |',
             '|---|---|---|---|---|---|---|']
    for r in RULES:
        for cell in CELLS:
            s = data[cell].get(r)
            if s is None:
                continue
            lr, seeds, params, ve = s
            loss = spread(seeds)
            delta = '-' if r == 'add' else two.fmt(d.get(cell, {}).get(r))
            count = f"{params:,}" + (f" ({ve:,} value emb.)" if ve else '')
            lines.append(f"| {r} | {name(cell)} | {lr:g} | {count} | {len(seeds)} | {loss} | {delta} |")
    return '\n'.join(lines)


def four_cells(d):
    """The paired differences from additive side by side: block x depth under AdamW, then the two questions: does the
    gain grow with depth (Δ16 - Δ4, independent runs, standard errors added in quadrature, read on the smaller n's
    degrees of freedom), and does the 16-layer reading survive the modern block."""
    cells = [c for c in CELLS if c[1] == 'adamw']
    lines = ['| rule | ' + ' | '.join(name(c) for c in cells) + ' | Δ16 − Δ4, GPT-2 | Δ16 − Δ4, modern | '
             'at 16 layers: GPT-2 → modern |', '|---|' + '---|' * (len(cells) + 3)]
    for r in RULES[1:]:
        ps = {c: d.get(c, {}).get(r) for c in cells}
        growth = []
        for block in ('gpt2', 'modern'):
            a, b = ps[(block, 'adamw', 16)], ps[(block, 'adamw', 4)]
            if a and b:
                se, n = math.hypot(a[1], b[1]), min(a[2], b[2])
                growth.append(two.fmt((a[0] - b[0], se, n)))
            else:
                growth.append('-')
        g, m = ps[('gpt2', 'adamw', 16)], ps[('modern', 'adamw', 16)]
        claim = two.CLAIM[(two.verdict(g), two.verdict(m))] if g and m else '-'
        lines.append(f"| {r} | " + ' | '.join(two.fmt(ps[c]) if ps[c] else '-' for c in cells) + ' | '
                     + ' | '.join(growth) + f" | {claim} |")
    return '\n'.join(lines)


def muon_table(data, d):
    """The Muon cell's rules: the paired difference from additive under Muon, and from the same rule under AdamW in the
    modern block at 16 layers (seed by seed: what Muon changes)."""
    muon, adamw = ('modern', 'muon', 16), ('modern', 'adamw', 16)
    lines = ['| rule | muon_lr | final val loss | Δ vs additive, Muon | Muon − AdamW, same rule |',
             '|---|---|---|---|---|']
    for r, (lr, seeds, _, _) in data[muon].items():
        loss = spread(seeds)
        vs_add = '-' if r == 'add' else two.fmt(d.get(muon, {}).get(r))
        vs_adamw = two.fmt(two.paired(seeds, data[adamw][r][1])) if r in data[adamw] else '-'
        lines.append(f"| {r} | {lr:g} | {loss} | {vs_add} | {vs_adamw} |")
    return '\n'.join(lines)


def rates_table(data):
    """The chosen rate of each rule against depth, in each block and optimizer."""
    cells = list(CELLS)
    lines = ['| rule | ' + ' | '.join(name(c) for c in cells) + ' |', '|---|' + '---|' * len(cells)]
    for r in RULES:
        lines.append(f"| {r} | " + ' | '.join(f"{data[c][r][0]:g}" if r in data[c] else '-' for c in cells) + ' |')
    return '\n'.join(lines)


def muon_configs(data, d):
    """The Muon cell's configs, each with --per its AdamW rate of the modern block at 16 layers (for the parameters
    Muon leaves to AdamW): additive, and every rule better than additive there under AdamW; orthogonal and rotation
    where none is (the rules whose update is itself orthogonal, beside an optimizer that orthogonalises the step).
    None while a rule of that cell lacks its five seeds."""
    cell = ('modern', 'adamw', 16)
    if len(d.get(cell, {})) < len(RULES) - 1 or any(p[2] < 5 for p in d[cell].values()):
        return None
    better = [r for r in RULES[1:] if two.verdict(d[cell][r]) == 'better']
    rules = ['add', *(better or ['ortho', 'rot'])]
    return ([f'config/shakespeare_{r}.py' for r in rules]
            + [f'--per=shakespeare_{r}:learning_rate={data[cell][r][0]:g}' for r in rules])


def figure(d, path):
    """Each rule's paired difference from additive in each cell, with its 95% t interval: below 0 is better."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    cells = [c for c in CELLS if c in d]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(len(cells), 1)
    for k, cell in enumerate(cells):
        xs, ys, half = [], [], []
        for i, r in enumerate(RULES[1:]):
            p = d[cell].get(r)
            if p:
                xs.append(i + (k - (len(cells) - 1) / 2) * width)
                ys.append(p[0])
                half.append(two.T95[p[2] - 1] * p[1])
        ax.errorbar(xs, ys, yerr=half, fmt='o', capsize=3, label=f"{name(cell)} layers")
    ax.axhline(0, color='grey', lw=0.8)
    ax.set_xticks(range(len(RULES) - 1), RULES[1:])
    ax.set_ylabel('final val loss − additive (paired, 95% t)')
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches='tight')


def collect(out):
    """Copy the ended runs' log.jsonl, config.json and run.json, and compile.md, from OUT/CELL/ to CELL/ here."""
    for cell, folder in CELLS.items():
        if cell[2] != 16:
            continue
        src = os.path.join(out, os.path.basename(folder))
        for run in sorted(os.listdir(src)) if os.path.isdir(src) else []:
            if run.startswith('shakespeare_') and two.final(os.path.join(src, run)):
                os.makedirs(os.path.join(folder, run), exist_ok=True)
                for f in ('log.jsonl', 'config.json', 'run.json', 'dynamics.jsonl'):
                    if os.path.exists(os.path.join(src, run, f)):
                        shutil.copyfile(os.path.join(src, run, f), os.path.join(folder, run, f))
        if os.path.exists(os.path.join(src, 'compile.md')):
            shutil.copyfile(os.path.join(src, 'compile.md'), os.path.join(folder, 'compile.md'))


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--collect', metavar='OUT', help='copy in the ended runs of OUT/CELL/ first')
    p.add_argument('--muon', action='store_true', help="print the Muon cell's configs (none: its AdamW cell is not done)")
    p.add_argument('--figure', metavar='PNG', help='draw the paired differences to PNG')
    args = p.parse_args()
    if args.collect:
        collect(args.collect)
    data = summaries()
    d = deltas(data)
    if args.muon:
        configs = muon_configs(data, d)
        if configs is None:
            raise SystemExit('the modern block at 16 layers has not finished its seeds')
        print(' '.join(configs))
        raise SystemExit
    print('Tuning, seed 1337: final val loss at each rate (-: not run)')
    print(tuning_table())
    print('\nThe chosen rates, seeds 1-5 at them (4 layers: seeds 1-3):\n')
    print(main_table(data, d))
    print('\nΔ vs additive in each cell, and the two questions:\n')
    print(four_cells(d))
    if data[('modern', 'muon', 16)]:
        print('\nMuon at 16 layers in the modern block:\n')
        print(muon_table(data, d))
    print('\nThe chosen rate against depth:\n')
    print(rates_table(data))
    if args.figure:
        figure(d, args.figure)
