"""Training dynamics per block, from runs trained with --dynamics=True: Fig. 3 and Fig. 10 of
G. Oh et al., "Revisiting Residual Connections: Orthogonal Updates for Stable and Efficient Deep
Networks", NeurIPS 2025, arXiv:2505.11881.

    python tools/plot_dynamics.py out-shakespeare-add-cpu out-shakespeare-ortho-cpu --out out-plots/dynamics

Reads OUT_DIR/dynamics.jsonl and OUT_DIR/log.jsonl of each run and writes, per statistic
(stream norm ||x||^2, ||f_par||^2, ||f_perp||^2, cos(x, f), and theta = ||f_perp|| / ||x||, the
rotation angle on the sphere; for mHC, H_res's off-diagonal mass, its Frobenius distance from I
and, where it is orthogonal, its rotation angle: orthogpt/diagnostics.py's mixing_stats),
OUT_<stat>.png: attention and MLP rows, one column per block, one colour per run, H_res's on a
symmetric log scale (linear below 1e-3, so that 0 shows); OUT_stream_by_depth.png, ||x||² of what each
sublayer's branch read at the last measurement against depth, a line per run (whether the stream grows with depth,
as Attention Residuals, Kimi Team, arXiv:2603.15031, Sec. 5.2, report of PreNorm); and OUT_effective_rank.png, the
effective rank of the final representation at each evaluation. Prints each run's last
measurement of every statistic, the mean over its sublayers.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from orthogpt import errors, logs, plots  # noqa: E402
from orthogpt.diagnostics import STATS  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402

TITLES = {'stream_sq': '||x||²', 'par_sq': '||f_par||²', 'perp_sq': '||f_perp||²', 'cos': 'cos(x, f)',
          'theta': 'θ = ||f_perp|| / ||x||', 'res_offdiag': 'H_res off-diagonal mass', 'res_dist': '||H_res - I||_F',
          'res_angle': 'H_res rotation angle (rad)'}
LOG_SCALE = ('res_offdiag', 'res_dist', 'res_angle')  # from 0 or 1e-3 at init to order 1


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


@errors.entry
def main(argv=None):
    args = plots.run_arguments(argv, __doc__, 'out-plots/dynamics', 'prefix of the PNG files')
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    runs = [(read(d, 'dynamics'), read(d, 'log')) for d in args.runs]
    os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
    runs = [(label(d), records, log) for d, (records, log) in zip(args.runs, runs)]
    n_blocks = max(len(records[0]['attn']['cos']) for _, records, _ in runs)
    written = []
    for stat in STATS:
        drawn = [name for name, records, _ in runs
                 if any(v is not None for r in records for sub in ('attn', 'mlp') for v in measured(r, sub, stat))]
        if not drawn:
            continue  # a statistic no run measured (H_res of one-stream rules, logs of older runs)
        legend_rows = -(-len(drawn) // 3)  # a legend of three columns
        fig, axes = plt.subplots(2, n_blocks, figsize=(2.6 * n_blocks, 4.6 + 0.2 * legend_rows), squeeze=False,
                                 sharex=True)
        for row, sub in enumerate(('mlp', 'attn')):
            for block in range(n_blocks):
                ax = axes[row][block]
                for color, (name, records, _) in enumerate(runs):
                    points = [(r['iter'], v[block]) for r in records for v in [measured(r, sub, stat)]
                              if block < len(v) and v[block] is not None]
                    if points:
                        ax.plot(*zip(*points), color=f'C{color}', lw=1, label=name)
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
        written.append(f"{args.out}_{stat}.png")
        fig.savefig(written[-1], dpi=110, bbox_inches='tight')  # a legend wider than the panels stays whole
        plt.close(fig)

    def finish(fig, ax, xlabel, ylabel, name, fontsize):  # a one-panel figure: labels, legend, file
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        fig.tight_layout()
        ax.legend(fontsize=fontsize, loc='upper left', bbox_to_anchor=(1.01, 1))  # beside the axes: hides no line
        written.append(f"{args.out}_{name}.png")
        fig.savefig(written[-1], dpi=110, bbox_inches='tight')
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))  # the stream by depth: does it grow with the layers (PreNorm's dilution)?
    for color, (name, records, _) in enumerate(runs):
        last = records[-1]
        depth = [v for pair in zip(measured(last, 'attn', 'stream_sq'), measured(last, 'mlp', 'stream_sq')) for v in pair]
        ax.plot(range(1, len(depth) + 1), depth, color=f'C{color}', marker='.', label=f"{name}, iter {last['iter']}")
    ax.set_yscale('log')
    ax.xaxis.get_major_locator().set_params(integer=True)
    finish(fig, ax, 'sublayer (attention, MLP, attention, ...)', '||x||² of what the branch read', 'stream_by_depth', 6)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for color, (name, _, log) in enumerate(runs):
        points = [(r['iter'], r['effective_rank']) for r in log if 'effective_rank' in r]
        if points:
            ax.plot(*zip(*points), color=f'C{color}', marker='.', label=name)
    finish(fig, ax, 'iteration', 'effective rank of the final representation', 'effective_rank', 7)
    print('wrote ' + ', '.join(written))
    print(final_table(runs))


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
