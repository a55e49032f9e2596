"""Training dynamics per block, from runs trained with --dynamics=True: Fig. 3 and Fig. 10 of
G. Oh et al., "Revisiting Residual Connections: Orthogonal Updates for Stable and Efficient Deep
Networks", NeurIPS 2025, arXiv:2505.11881.

    python tools/plot_dynamics.py out-shakespeare-add-cpu out-shakespeare-ortho-cpu --out out-plots/dynamics

Reads OUT_DIR/dynamics.jsonl and OUT_DIR/log.jsonl of each run and writes, per statistic
(stream norm ||x||^2, ||f_par||^2, ||f_perp||^2, cos(x, f), and theta = ||f_perp|| / ||x||, the
rotation angle on the sphere), OUT_<stat>.png: attention and MLP rows, one column per block, one
colour per run;
and OUT_effective_rank.png, the effective rank of the final representation at each evaluation.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from orthogpt import errors, logs, plots  # noqa: E402
from orthogpt.diagnostics import STATS  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402

TITLES = {'stream_sq': '||x||²', 'par_sq': '||f_par||²', 'perp_sq': '||f_perp||²', 'cos': 'cos(x, f)',
          'theta': 'θ = ||f_perp|| / ||x||'}


def read(out_dir, name):
    records = logs.read(out_dir, name)
    if not records:
        raise UserError(f"no {os.path.join(out_dir, name + '.jsonl')}; train the run with --dynamics=True")
    return records


def label(out_dir):
    with open(os.path.join(out_dir, 'config.json')) as f:
        cfg = json.load(f)
    return f"{os.path.basename(os.path.normpath(out_dir))} ({cfg['residual']}, qkv={cfg['qkv']})"


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
        if not any(v is not None for _, records, _ in runs for v in records[0]['attn'][stat]):
            continue  # a statistic no run measured (logs of older runs)
        fig, axes = plt.subplots(2, n_blocks, figsize=(2.6 * n_blocks, 5), squeeze=False, sharex=True)
        for row, sub in enumerate(('mlp', 'attn')):
            for block in range(n_blocks):
                ax = axes[row][block]
                for color, (name, records, _) in enumerate(runs):
                    points = [(r['iter'], r[sub][stat][block]) for r in records
                              if block < len(r[sub][stat]) and r[sub][stat][block] is not None]
                    if points:
                        ax.plot(*zip(*points), color=f'C{color}', lw=1, label=name)
                if stat == 'cos':
                    ax.axhline(0, color='k', ls='--', lw=0.8)
                ax.set_title(f"{'MLP' if sub == 'mlp' else 'attention'} block {block}", fontsize=8)
                ax.tick_params(labelsize=7)
        axes[1][0].set_xlabel('iteration')
        axes[0][0].set_ylabel(TITLES[stat])
        axes[1][0].set_ylabel(TITLES[stat])
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc='upper center', ncol=len(runs), fontsize=8)
        fig.tight_layout(rect=(0, 0, 1, 0.93))
        written.append(f"{args.out}_{stat}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for color, (name, _, log) in enumerate(runs):
        points = [(r['iter'], r['effective_rank']) for r in log if 'effective_rank' in r]
        if points:
            ax.plot(*zip(*points), color=f'C{color}', marker='.', label=name)
    ax.set_xlabel('iteration')
    ax.set_ylabel('effective rank of the final representation')
    ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(f"{args.out}_effective_rank.png")
    fig.savefig(written[-1], dpi=110)
    print('wrote ' + ', '.join(written))


if __name__ == '__main__':
    main()
