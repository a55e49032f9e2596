"""Training dynamics per block, from runs trained with --dynamics=True: Fig. 3 and Fig. 10 of
G. Oh et al., "Revisiting Residual Connections: Orthogonal Updates for Stable and Efficient Deep
Networks", NeurIPS 2025, arXiv:2505.11881; and the gains across depth of Z. Xie et al., "mHC:
Manifold-Constrained Hyper-Connections", arXiv:2512.24880, Fig. 3 and 7.

    python tools/plot_dynamics.py out-shakespeare-add-cpu out-shakespeare-ortho-cpu --out out-plots/dynamics

Reads OUT_DIR/dynamics.jsonl and OUT_DIR/log.jsonl of each run and writes, per statistic (stream norm ||x||^2,
||f_par||^2, ||f_perp||^2, cos(x, f), and theta = ||f_perp|| / ||x||, the rotation angle on the sphere; for mHC,
H_res's off-diagonal mass, its Frobenius distance from I and, where it is orthogonal, its rotation angle:
orthogpt/diagnostics.py's mixing_stats), OUT_<stat>.png: attention and MLP rows, one column per block (8 evenly
spaced beyond 8), one colour per run, H_res's on a symmetric log scale (linear below 1e-3, so that 0 shows);
OUT_stream_by_depth.png, ||x||² of what each sublayer's branch read at the last measurement against depth, a line
per run (whether the stream grows with depth, as Attention Residuals, Kimi Team, arXiv:2603.15031, Sec. 5.2, report
of PreNorm); and OUT_effective_rank.png, the effective rank of the final representation at each evaluation. At the
last measurement, against the sublayer (or the last that measured it: the stream map's gains come less often;
docs/rules.md, "Diagnostics across depth", defines each): OUT_magnitudes.png, each sublayer's output and the
gradient of the loss at it and at its branch output; OUT_stream_gain.png, the gain of the stream map from each
sublayer to the end, its largest and its root-mean-square singular value; for the wide rules OUT_mixing_gain.png,
the row (forward) and column (backward) sums of H_res, each sublayer's and the composite from it to the last (mHC's
Fig. 3 (a) and (b)); and each mechanism's own weights: OUT_attnres_weights.png (Attention Residuals' alpha_{i->l}, a
heat map), OUT_denseformer_alpha.png (DenseFormer's weights, a heat map) and OUT_ddl_beta.png (DDL's beta, a
histogram per sublayer as a heat map, and the fractions within 0.1 of 0, 1 and 2). Prints each run's last
measurement of every statistic, the mean over its sublayers.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from orthogpt import errors, logs, plots  # noqa: E402
from orthogpt.diagnostics import BETA_BINS, STATS  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402

TITLES = {'stream_sq': '||x||²', 'par_sq': '||f_par||²', 'perp_sq': '||f_perp||²', 'cos': 'cos(x, f)',
          'theta': 'θ = ||f_perp|| / ||x||', 'res_offdiag': 'H_res off-diagonal mass', 'res_dist': '||H_res - I||_F',
          'res_angle': 'H_res rotation angle (rad)'}
LOG_SCALE = ('res_offdiag', 'res_dist', 'res_angle')  # from 0 or 1e-3 at init to order 1
COLUMNS = 8  # the most blocks a per-block figure draws
SUBLAYER = 'sublayer l (attention, MLP, attention, ...)'
# the figures against the sublayer: (name, [(panel title, [(stat, line style, legend)])])
BY_DEPTH = [
    ('stream_by_depth', [('||x||² of what the branch read', [('stream_sq', '-', '')])]),
    ('magnitudes', [('||x^(l)||, the output (mean over tokens)', [('out_norm', '-', '')]),
                    ('gradient norm (mean over tokens)', [('out_grad', '-', 'd loss / d x^(l)'),
                                                          ('branch_grad', '--', 'd loss / d u^(l), the branch')])]),
    ('stream_gain', [('gain of the stream map x_l -> x_end', [('map_max', '-', 'largest singular value'),
                                                            ('map_rms', '--', 'root mean square')])]),
    ('mixing_gain', [(f'{of}: |row sum| forward, |column sum| backward',
                      [(f'{key}_fwd_max', '-', 'forward, max'), (f'{key}_bwd_max', '--', 'backward, max'),
                       (f'{key}_fwd_min', ':', 'forward, min'), (f'{key}_bwd_min', '-.', 'backward, min'),
                       (f'{key}_fwd_norm', (0, (6, 2)), 'forward, max Σ|row|'),
                       (f'{key}_bwd_norm', (0, (1, 3)), 'backward, max Σ|column|')])
                     for of, key in (("each sublayer's H_res", 'mix'), ('composite, sublayer l to the last', 'comp'))]),
]

HEATMAPS = {  # key: (title, the readers' axis, their names from their number)
    'attnres_weights': ("Attention Residuals' α_{i→l}, mean over tokens", 'reader: sublayer l, or the output',
                        lambda n: [*map(str, range(1, n)), 'out']),
    'denseformer_alpha': ("DenseFormer's weights α_{i,j}", 'block i', lambda n: list(map(str, range(n))))}


def read(out_dir, name):
    records = logs.read(out_dir, name)
    if not records:
        raise UserError(f"no {os.path.join(out_dir, name + '.jsonl')}; train the run with --dynamics=True")
    return records


def label(out_dir):
    with open(os.path.join(out_dir, 'config.json')) as f:
        cfg = json.load(f)
    return f"{os.path.basename(os.path.normpath(out_dir))} ({cfg['residual']}, qkv={cfg['qkv']})"


def measured(record, sub, stat):
    """The per-block values of stat in one dynamics record (None where not measured; [] in logs older than it)."""
    return record[sub].get(stat, [])


def by_depth(record, stat):
    """stat of every sublayer of one record in forward order (attention, MLP, attention, ...)."""
    return [v for pair in zip(measured(record, 'attn', stat), measured(record, 'mlp', stat)) for v in pair]


def save(fig, path, written):
    fig.savefig(path, dpi=110, bbox_inches='tight')  # a legend wider than the panels stays whole
    written.append(path)
    import matplotlib.pyplot as plt
    plt.close(fig)


@errors.entry
def main(argv=None):
    args = plots.run_arguments(argv, __doc__, 'out-plots/dynamics', 'prefix of the PNG files')
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    runs = [(read(d, 'dynamics'), read(d, 'log')) for d in args.runs]
    os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
    runs = [(label(d), records, log) for d, (records, log) in zip(args.runs, runs)]
    written = []
    stat_figures(plt, runs, args.out, written)
    for name, panels in BY_DEPTH:
        depth_figure(plt, runs, f"{args.out}_{name}.png", panels, written)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for color, (name, _, log) in enumerate(runs):
        points = [(r['iter'], r['effective_rank']) for r in log if 'effective_rank' in r]
        if points:
            ax.plot(*zip(*points), color=f'C{color}', marker='.', label=name)
    ax.set_xlabel('iteration')
    ax.set_ylabel('effective rank of the final representation')
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1))  # beside the axes: hides no line
    save(fig, f"{args.out}_effective_rank.png", written)
    for key in HEATMAPS:
        heatmaps(plt, runs, f"{args.out}_{key}.png", key, written)
    beta_figure(plt, runs, f"{args.out}_ddl_beta.png", written)
    print('wrote ' + ', '.join(written))
    print(final_table(runs))


def stat_figures(plt, runs, out, written):
    """OUT_<stat>.png for each of STATS that some run measured: attention and MLP rows, a column per block, the
    statistic against the iteration, a line per run. Beyond COLUMNS blocks, COLUMNS of them evenly spaced from the
    first to the last (a column per block of 32 made a figure 9,000 px wide): the figures against the sublayer show
    every one at the last measurement."""
    n_blocks = max(len(records[0]['attn']['cos']) for _, records, _ in runs)
    blocks = sorted({round(i * (n_blocks - 1) / (COLUMNS - 1)) for i in range(COLUMNS)}) if n_blocks > COLUMNS \
        else range(n_blocks)
    for stat in STATS:
        drawn = [name for name, records, _ in runs
                 if any(v is not None for r in records for sub in ('attn', 'mlp') for v in measured(r, sub, stat))]
        if not drawn:
            continue  # a statistic no run measured (H_res of one-stream rules, logs of older runs)
        legend_rows = -(-len(drawn) // 3)  # a legend of three columns
        fig, axes = plt.subplots(2, len(blocks), figsize=(2.6 * len(blocks), 4.6 + 0.2 * legend_rows), squeeze=False,
                                 sharex=True)
        for row, sub in enumerate(('mlp', 'attn')):
            for column, block in enumerate(blocks):
                ax = axes[row][column]
                for color, (name, records, _) in enumerate(runs):
                    points = [(r['iter'], v[block]) for r in records for v in [measured(r, sub, stat)]
                              if block < len(v) and v[block] is not None]
                    if points:
                        # a marker, so that a run of one record shows
                        ax.plot(*zip(*points), color=f'C{color}', lw=1, marker='.', ms=3, label=name)
                if stat == 'cos':
                    ax.axhline(0, color='k', ls='--', lw=0.8)
                if stat in LOG_SCALE:
                    ax.set_yscale('symlog', linthresh=1e-3)
                ax.set_title(f"{'MLP' if sub == 'mlp' else 'attention'} block {block}", fontsize=8)
                ax.tick_params(labelsize=7)
        axes[1][0].set_xlabel('iteration')
        axes[0][0].set_ylabel(TITLES[stat])
        axes[1][0].set_ylabel(TITLES[stat])
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc='upper center', ncol=min(len(drawn), 3), fontsize=7)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.2 * legend_rows / (4.6 + 0.2 * legend_rows) - 0.02))
        save(fig, f"{out}_{stat}.png", written)


def last_measuring(records, stat):
    """The last record that measured stat (the stream map's gains come every dynamics_gain_interval), else the last."""
    return next((r for r in reversed(records) if any(v is not None for v in by_depth(r, stat))), records[-1])


def depth_figure(plt, runs, path, panels, written):
    """A figure of panels against the sublayer at each run's last measurement of each statistic, a colour per run and
    a line style per statistic, on log axes; none where no run measured any of its statistics (a rule without them,
    older logs)."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import LogFormatter
    drawn = [[(color, name, last, stat, style) for color, (name, records, _) in enumerate(runs)
              for stat, style, _ in stats for last in [last_measuring(records, stat)]
              if any(v is not None for v in by_depth(last, stat))]
             for _, stats in panels]
    if not any(drawn):
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.5), squeeze=False)
    for ax, (title, _), lines in zip(axes[0], panels, drawn):
        for color, _, last, stat, style in lines:
            values = [float('nan') if v is None else v for v in by_depth(last, stat)]
            ax.plot(range(1, len(values) + 1), values, color=f'C{color}', ls=style, marker='.')
        ax.set_yscale('log')
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):  # 1.5, not 1.5 x 10^0
            axis(LogFormatter(labelOnlyBase=False))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel(SUBLAYER)
        ax.set_title(title, fontsize=9)
    shown = dict.fromkeys((color, name, last['iter']) for lines in drawn for color, name, last, _, _ in lines)
    styles = dict.fromkeys((style, what) for _, stats in panels for _, style, what in stats if what)
    handles = ([Line2D([], [], color=f'C{color}', marker='.', label=f"{name}, iter {it}") for color, name, it in shown]
               + [Line2D([], [], color='k', ls=style, label=what) for style, what in styles])
    fig.tight_layout()
    fig.legend(handles=handles, loc='upper center', bbox_to_anchor=(0.5, 0), ncol=2, fontsize=7)
    save(fig, path, written)


def ticks(n):
    """Every tick up to 16, else about 16 of them: a 65-column map's labels otherwise overlap."""
    return range(0, n, max(1, -(-n // 16)))


def heatmaps(plt, runs, path, key, written):
    """A heat map per run whose last measurement holds key (HEATMAPS): rows the readers in order, columns their
    sources in order (the embeddings first), each row as long as its reader's sources, the values written in where
    there is room. The colour scale is linear within 0.01 of 0 and logarithmic beyond, so that the weights of a deep
    model (uniform over 65 sources is 0.015) show beside its few large ones."""
    import matplotlib.colors
    import numpy as np
    found = [(name, records[-1]) for name, records, _ in runs if key in records[-1]]
    if not found:
        return
    title, readers, names = HEATMAPS[key]
    fig, axes = plt.subplots(1, len(found), figsize=(4.5 * len(found), 4), squeeze=False)
    for ax, (name, last) in zip(axes[0], found):
        rows = last[key]
        grid = np.full((len(rows), max(map(len, rows))), np.nan)
        for i, row in enumerate(rows):
            grid[i, :len(row)] = row
        top = max(np.nanmax(np.abs(grid)), 0.01)
        scale = matplotlib.colors.SymLogNorm(0.01, linscale=0.5, vmin=-top, vmax=top)  # 0 white
        fig.colorbar(ax.imshow(grid, cmap='RdBu_r', norm=scale, aspect='auto'), ax=ax, shrink=0.8)
        for (i, j), v in np.ndenumerate(grid if grid.shape[1] <= 12 else []):
            if not np.isnan(v):
                ax.text(j, i, f'{v:.2f}', ha='center', va='center', fontsize=6, color='w' if abs(v) > top / 2 else 'k')
        ax.set_xticks(ticks(grid.shape[1]))
        labels = names(len(rows))
        ax.set_yticks(ticks(len(rows)), [labels[i] for i in ticks(len(rows))])
        ax.set_xlabel('source (0: the embeddings, then each output in order)', fontsize=8)
        ax.set_ylabel(readers, fontsize=8)
        ax.set_title(f"{name}, iter {last['iter']}", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save(fig, path, written)


def beta_figure(plt, runs, path, written):
    """DDL's beta at each run's last measurement: the histogram of each sublayer as a row of a heat map (the fraction
    of the tokens in each bin) and, beside it, the fractions near 0, 1 and 2 (within 0.1: the bins at the ends and
    the two beside 1) against the sublayer."""
    import matplotlib.ticker
    import numpy as np
    found = [(name, records[-1]) for name, records, _ in runs if 'ddl_beta' in records[-1]]
    if not found:
        return
    fig, axes = plt.subplots(len(found), 2, figsize=(10, 3.5 * len(found)), squeeze=False,
                             gridspec_kw={'width_ratios': (3, 2)})
    for (hist_ax, near_ax), (name, last) in zip(axes, found):
        hists = np.array(last['ddl_beta'])  # (sublayers, BETA_BINS)
        shown = hist_ax.imshow(hists, cmap='viridis', aspect='auto', vmin=0, interpolation='nearest',
                               extent=(0, 2, len(hists) + 0.5, 0.5))
        fig.colorbar(shown, ax=hist_ax, shrink=0.8, label='fraction of the tokens')
        hist_ax.set(xlabel='β (DDL): 0 keeps x, 1 sets <k, x> = v, 2 reflects', ylabel=SUBLAYER)
        hist_ax.set_title(f"{name}, iter {last['iter']}", fontsize=8)
        near = {'near 0': hists[:, 0], 'near 1': hists[:, BETA_BINS // 2 - 1] + hists[:, BETA_BINS // 2],
                'near 2': hists[:, -1]}
        for style, (label, fraction) in zip(('-', '--', ':'), near.items()):
            near_ax.plot(range(1, len(hists) + 1), fraction, style, marker='.', label=label)
        near_ax.set(xlabel=SUBLAYER, ylabel='fraction of the tokens (within 0.1)', ylim=(0, 1))
        near_ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        near_ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path, written)


def final_table(runs):
    """A Markdown table: each run's last dynamics record, every statistic as its mean over the sublayers that
    measured it ('-' where none did)."""
    lines = ['| run | iter | ' + ' | '.join(STATS) + ' |', '|---|---|' + '---|' * len(STATS)]
    for name, records, _ in runs:
        last = records[-1]
        cells = []
        for stat in STATS:
            values = [v for sub in ('attn', 'mlp') for v in measured(last, sub, stat) if v is not None]
            cells.append(f"{sum(values) / len(values):.4g}" if values else '-')
        lines.append(f"| {name} | {last['iter']} | " + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


if __name__ == '__main__':
    main()
