"""The depth ladder's tables (docs/results.md, "The depth ladder"), from the runs that run.sh trains in OUT (default
out-compare/ladder; folders CONFIG-n_layerL-sS as compare.py names them):

  1. final val loss by rule and depth (seed 1), at 16 layers mean ± std over seeds 1-3 and the difference from
     additive paired by seed (mean ± s.e.), and each cell's parameters;
  2. the stream map's gain from the first sublayer to the output (map_max: the largest singular value of dx_end/dx_0)
     and its typical gain (map_rms), at the last dynamics record, by rule and depth;
  3. HC's and mHC's composite mixing gain against sublayer at 32 layers (forward: max |row sum| and max sum of a
     row's |entries|; backward: the same of the columns), the analogue of mHC's Fig. 3 (b);
  4. each mechanism's own weights by depth: DDL's beta, Attention Residuals' depth weights, DenseFormer's weights;
  5. with --ablate, each ablation's change in validation loss at 16 layers (tools/ablate.py on seeds 1-3, mean ± s.e.).

    python docs/logs/depth_ladder/table.py [--out=out-compare/ladder] [--ablate] [--collect] [--plots=docs]

--collect copies the finished runs' logs (log.jsonl, config.json, dynamics.jsonl, and ablate.md, the ablations'
table) to runs/ beside this file, where the tables read them when OUT is gone; --plots writes ladder_loss.png (final
val loss against depth) and ladder_gain.png (map_max and map_rms from the first sublayer against depth) to a folder.
HC's and mHC's composite gains by sublayer at 32 layers, as figures: python tools/plot_dynamics.py
OUT/shakespeare_hc-n_layer32-s1 OUT/shakespeare_mhc-n_layer32-s1.
"""

import argparse
import itertools
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, '..', '..', '..'))
NAME = re.compile(r'(?P<config>.+)-n_layer(?P<depth>\d+)-s(?P<seed>\d+)$')
DEPTHS = (4, 8, 16, 32)
WAYS = {'max': 'max |sum|', 'norm': 'max sum of |entries|'}  # diagnostics.sum_gains' two readings


class Run(NamedTuple):
    loss: float  # final val loss
    dynamics: dict | None  # the last dynamics record
    params: int
    folder: str = ''


def read(folder):
    """The Run in folder (its folder left out) if it finished, else None."""
    try:
        records = [json.loads(line) for line in open(os.path.join(folder, 'log.jsonl'))]
        cfg = json.load(open(os.path.join(folder, 'config.json')))
    except OSError:
        return None
    evals = [r for r in records if 'val_loss' in r and r['iter'] == cfg['max_iters']]
    params = next(r['parameters'] for r in records if r.get('event') == 'start')
    dynamics = [json.loads(line) for line in open(os.path.join(folder, 'dynamics.jsonl'))] if os.path.exists(
        os.path.join(folder, 'dynamics.jsonl')) else []
    return Run(evals[-1]['val_loss'], dynamics[-1] if dynamics else None, params) if evals else None


def runs(out):
    """{(config, depth, seed): Run} of the finished runs."""
    found = {}
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        m, done = NAME.match(name), read(os.path.join(out, name))
        if m and done:
            found[(m['config'], int(m['depth']), int(m['seed']))] = done._replace(folder=os.path.join(out, name))
    return found


def mean_std(values):
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else '-'


def mean_se(d):
    """(mean, standard error) of d; the error NaN for one value."""
    return statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else math.nan


def paired(found, c, base='shakespeare_add'):
    """c's final val loss at 16 layers minus base's, paired by seed: mean ± s.e. over the seeds both finished."""
    d = [found[(c, 16, s)].loss - found[(base, 16, s)].loss for s in (1, 2, 3) if (c, 16, s) in found and
         (base, 16, s) in found]
    return '{:+.4f} ± {:.4f}'.format(*mean_se(d)) if len(d) > 1 else '-'


def first(record, stat):
    """The value of a stat at the first sublayer (block 0's attention) of a dynamics record."""
    value = record['attn'][stat][0] if record else None
    return '-' if value is None else f"{value:.3g}"


def tables(found, ablate):
    configs = list(dict.fromkeys(c for c, _, _ in found))
    out = ['| rule | ' + ' | '.join(f"{d} layers" for d in DEPTHS) + ' | 16 layers, seeds 1-3 | '
           '16 layers, − additive (paired) |', '|---|' + '---|' * (len(DEPTHS) + 2)]
    for c in configs:
        cells = [f"{found[(c, d, 1)].loss:.4f}" if (c, d, 1) in found else 'not finished' for d in DEPTHS]
        cells.append(mean_std([found[(c, 16, s)].loss for s in (1, 2, 3) if (c, 16, s) in found]))
        cells.append(paired(found, c) if c != 'shakespeare_add' else '')
        out.append(f"| `{c}` | " + ' | '.join(cells) + ' |')
    out += ['', '| rule: parameters | ' + ' | '.join(f"{d} layers" for d in DEPTHS) + ' |',
            '|---|' + '---|' * len(DEPTHS)]
    for c in configs:
        out.append(f"| `{c}` | " + ' | '.join(f"{found[(c, d, 1)].params:,}" if (c, d, 1) in found else '-'
                                               for d in DEPTHS) + ' |')
    out += ['', '| rule: map_max (map_rms) from sublayer 1 | ' + ' | '.join(f"{d} layers" for d in DEPTHS) + ' |',
            '|---|' + '---|' * len(DEPTHS)]
    for c in configs:
        out.append(f"| `{c}` | " + ' | '.join(
            f"{first(found[(c, d, 1)].dynamics, 'map_max')} ({first(found[(c, d, 1)].dynamics, 'map_rms')})"
            if (c, d, 1) in found else 'not finished' for d in DEPTHS) + ' |')
    for c in configs:
        record = found[(c, 32, 1)].dynamics if (c, 32, 1) in found else None
        if record and record['attn'].get('comp_fwd_max', [None])[0] is not None:
            for way, size in itertools.product(('fwd', 'bwd'), ('max', 'norm')):
                if f'comp_{way}_{size}' not in record['attn']:  # a log from before the stat was
                    continue
                gains = [v for pair in zip(record['attn'][f'comp_{way}_{size}'], record['mlp'][f'comp_{way}_{size}'])
                         for v in pair]
                out.append(f"\n`{c}` at 32 layers, composite {way} gain ({WAYS[size]}) by sublayer 1-64: "
                           + ', '.join(f"{g:.3g}" for g in gains))
    out += mechanisms(found)
    if ablate:
        out += ['', '| rule at 16 layers | ablation | change in val loss, seeds 1-3 (mean ± s.e.) |', '|---|---|---|']
        for c in configs:
            changes = {}
            for s in (1, 2, 3):
                if (c, 16, s) in found:
                    for name, change in ablations(found[(c, 16, s)].folder).items():
                        changes.setdefault(name, []).append(change)
            for name, d in changes.items():
                out.append('| `{}` | {} | {:+.4f} ± {:.4f} (n={}) |'.format(c, name, *mean_se(d), len(d)))
    return '\n'.join(out)


def mechanisms(found):
    """Table 4's lines: at each depth's last record (seed 1), DDL's beta (its mean over tokens and sublayers, from the
    histograms' bin centres, and the mean fractions within 0.1 of 0, 1 and 2), Attention Residuals' depth weights
    (each read's entropy over its log(sources), 1 when uniform, the mean over the reads from 2 sources on; and the
    output read's largest weight and its source) and DenseFormer's weights (the last block's on the embeddings, on its
    own output, and the sum of its |weights| on the other sources)."""
    stats = {
        'ddl_beta': ('DDL: mean β; fraction near 0, 1, 2', lambda h: '{:.2f}; {:.0%}, {:.0%}, {:.0%}'.format(
            statistics.mean(sum((i + 0.5) / len(r) * 2 * f for i, f in enumerate(r)) for r in h),
            *(statistics.mean(r[i] + (r[i - 1] if i == len(r) // 2 else 0) for r in h)
              for i in (0, len(h[0]) // 2, len(h[0]) - 1)))),
        'attnres_weights': ('Attention Residuals: entropy / log(sources); output read: largest α (source)',
                            lambda w: '{:.3f}; {:.2f} ({})'.format(
                                statistics.mean(-sum(a * math.log(a) for a in r if a > 0) / math.log(len(r))
                                                for r in w if len(r) > 1), max(w[-1]), w[-1].index(max(w[-1])))),
        'denseformer_alpha': (r'DenseFormer: last block on embeddings, on its own output; Σ\|others\|',
                              lambda a: f"{a[-1][0]:+.3f}, {a[-1][-1]:.3f}; {sum(map(abs, a[-1][1:-1])):.3f}")}
    out = []
    for key, (title, cell) in stats.items():
        records = {d: run.dynamics for (c, d, s), run in found.items() if s == 1 and run.dynamics and key in
                   run.dynamics}
        if records:
            out += ['', f'| {title} | ' + ' | '.join(f"{d} layers" for d in DEPTHS) + ' |',
                    '|---|' + '---|' * len(DEPTHS),
                    '| | ' + ' | '.join(cell(records[d][key]) if d in records else '-' for d in DEPTHS) + ' |']
    return out


def ablations(folder):
    """{ablation: change in val loss} of tools/ablate.py on a run (none for a rule without ablations). Its table is
    kept as ablate.md in the run's folder and read from there while it is newer than the checkpoint."""
    kept, ckpt = os.path.join(folder, 'ablate.md'), os.path.join(folder, 'best.pt')
    if not os.path.exists(kept) or os.path.exists(ckpt) and os.path.getmtime(ckpt) > os.path.getmtime(kept):
        done = subprocess.run([sys.executable, 'tools/ablate.py', f'--out_dir={folder}'], cwd=ROOT,
                              capture_output=True, text=True)
        if done.returncode and 'no ablation' not in done.stderr:
            raise SystemExit(f"tools/ablate.py --out_dir={folder} failed: "
                             f"{(done.stderr.strip() or '?').splitlines()[-1]}")
        with open(kept, 'w') as f:
            f.write(done.stdout or done.stderr)  # a rule without ablations: the reason
    rows = [line.split('|') for line in open(kept) if line.startswith('| ') and '(as trained)' not in line]
    return {r[1].strip(): float(r[3]) for r in rows if r[3].strip() not in ('', '-', 'change')}


def collect(found):
    """Copy each finished run's logs to runs/ here (the checkpoints stay where they are: tools/ablate.py reads them)."""
    for folder in (run.folder for run in found.values()):
        dest = os.path.join(HERE, 'runs', os.path.basename(folder))
        os.makedirs(dest, exist_ok=True)
        for f in ('log.jsonl', 'config.json', 'dynamics.jsonl', 'ablate.md'):
            if os.path.exists(os.path.join(folder, f)):
                shutil.copyfile(os.path.join(folder, f), os.path.join(dest, f))


def plots(found, folder):
    """ladder_loss.png and ladder_gain.png in folder: a line per rule against depth (seed 1; seeds 1-3's mean and
    std at 16 layers as an error bar), a loss far above the rest marked at the top edge with its value."""
    import matplotlib
    import matplotlib.ticker
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    configs = list(dict.fromkeys(c for c, _, _ in found))
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, c in enumerate(configs):
        depths = [d for d in DEPTHS if (c, d, 1) in found]
        ax.plot(depths, [found[(c, d, 1)].loss for d in depths], marker='o', color=f'C{i}', label=c)
        seeds = [found[(c, 16, s)].loss for s in (1, 2, 3) if (c, 16, s) in found]
        if len(seeds) > 1:
            ax.errorbar([16], [statistics.mean(seeds)], [statistics.stdev(seeds)], color=f'C{i}', capsize=3)
    losses = [run.loss for (_, _, s), run in found.items() if s == 1]
    cap = statistics.median(losses) + 0.5  # a run that failed (rotation at 32 layers) would squash the rest
    for (c, d, s), run in found.items():
        if s == 1 and run.loss > cap:
            ax.annotate(f"{c}: {run.loss:.2f} ↑", (d, cap), xytext=(-4, -12), textcoords='offset points', ha='right',
                        fontsize=7, color=f'C{configs.index(c)}')
    ax.set(xscale='log', xticks=DEPTHS, xticklabels=DEPTHS, xlabel='layers', ylabel='final val loss',
           ylim=(None, min(cap, max(losses) + 0.02)))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1))  # beside the axes: hides no line
    fig.savefig(os.path.join(folder, 'ladder_loss.png'), dpi=110, bbox_inches='tight')
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, stat in zip(axes, ('map_max', 'map_rms')):
        for i, c in enumerate(configs):
            records = [(d, found[(c, d, 1)].dynamics) for d in DEPTHS if (c, d, 1) in found]
            points = [(d, r['attn'][stat][0]) for d, r in records if r and r['attn'][stat][0]]
            if points:
                ax.plot(*zip(*points), marker='o', color=f'C{i}', label=c)
        ax.set(xscale='log', yscale='log', xticks=DEPTHS, xticklabels=DEPTHS, xlabel='layers',
               title=f'{stat} of x_1 -> x_end at the last record')
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    axes[0].legend(fontsize=7)
    fig.savefig(os.path.join(folder, 'ladder_gain.png'), dpi=110, bbox_inches='tight')


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out', help="the ladder's runs (default out-compare/ladder, else the logs in runs/ here)")
    p.add_argument('--ablate', action='store_true', help='run tools/ablate.py on the 16-layer runs')
    p.add_argument('--collect', action='store_true', help="copy the finished runs' logs to runs/ here")
    p.add_argument('--plots', metavar='FOLDER', help='write ladder_loss.png and ladder_gain.png there')
    args = p.parse_args()
    out = args.out or os.path.join(ROOT, 'out-compare', 'ladder')
    if not os.path.isdir(out) and (args.out or args.collect):
        p.error(f"{out} is not a folder: --out names the ladder's runs, which --collect needs")
    found = runs(out if os.path.isdir(out) else os.path.join(HERE, 'runs'))
    text = tables(found, args.ablate)  # before --collect, which copies the ablations' tables
    if args.collect:
        collect(found)
    if args.plots:
        os.makedirs(args.plots, exist_ok=True)
        plots(found, args.plots)
    print(text)
