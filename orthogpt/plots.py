"""Figures of runs: the command line of a tool that draws some (run_arguments), and validation
curves in one figure, the val loss (and top-1 for images) against iteration, the mean over each
group's seeds, a line per group (curves); and a scaling series' final loss against compute and wall time
(scaling)."""

import argparse
import statistics

from orthogpt import files


def run_arguments(argv, doc, out, what, runs='out_dir of each run'):
    """The arguments of a tool that draws runs: the runs, and --out (default `out`, `what` it is)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('runs', nargs='+', help=runs)
    p.add_argument('--out', default=out, help=what)
    return p.parse_args(argv)


def curves(groups, path, switch_at=None):
    """groups: {label: [curve of each seed]}, a curve being logs.evaluations(...) of one run; a
    dashed line at switch_at. Writes the PNG at path."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    groups = {label: runs for label, runs in groups.items() if runs}
    if not groups:
        print("no finished runs: no figure")
        return
    images = any(p[2] is not None for runs in groups.values() for run in runs for p in run)
    fig, axes = plt.subplots(1, 2 if images else 1, figsize=(11 if images else 6, 4), squeeze=False)
    late = [[], []]  # values after the first quarter of training, which set the y range
    for label, runs in groups.items():
        iters = [it for it, _, _ in runs[0]]
        for ax, col, seen in zip(axes[0], (1, 2), late):
            ys = [[p[col] for p in run] for run in runs if len(run) == len(iters)]
            mean = [statistics.mean(v) for v in zip(*ys)]
            ax.plot(iters, mean, label=f"{label} (n={len(ys)})")
            seen += [m for it, m in zip(iters, mean) if it >= iters[-1] / 4]
    for ax, name, seen in zip(axes[0], ('val loss', 'top-1 %'), late):
        if seen:  # the first evaluations would squash the differences at the end
            pad = (max(seen) - min(seen)) * 0.05 or 0.01
            ax.set_ylim(min(seen) - pad, max(seen) + pad)
        if switch_at:
            ax.axvline(switch_at, color='grey', lw=0.8, ls='--')
        ax.set_xlabel('iteration')
        ax.set_ylabel(f"{name}, mean over seeds")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    files.write_atomic(path, lambda f: fig.savefig(f, dpi=120, format='png'))
    plt.close(fig)
    print(f"wrote {path}")


def scaling(series, path):
    """series: {label: {'compute': [FLOPs], 'wall': [seconds], 'loss': [mean], 'loss_std': [std], 'fit': (FLOPs,
    losses) or None}}, a point per size (the mean over its seeds). Two log-log panels, a line per label: the
    loss against compute (the fit dashed, in the line's colour) and against wall time. Writes the PNG at path."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (label, s) in enumerate(series.items()):
        color = f"C{i % 10}"
        for ax, x in zip(axes, (s['compute'], s['wall'])):
            points = [(a, b, e) for a, b, e in zip(x, s['loss'], s['loss_std']) if a and b]
            if points:
                xs, ys, es = zip(*points)
                ax.errorbar(xs, ys, yerr=es, color=color, marker='o', ms=4, capsize=2, label=label)
        if s.get('fit'):
            axes[0].plot(*s['fit'], color=color, ls='--', lw=1)
    for ax, name in zip(axes, ('training compute (FLOPs)', 'training wall time (s)')):
        ax.set_xscale('log')
        ax.set_yscale('log')
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):  # losses span less than a decade
            axis(FormatStrFormatter('%g'))
        ax.set_xlabel(name)
        ax.set_ylabel('final val loss, mean over seeds')
        ax.grid(alpha=0.3, which='both')
    axes[0].set_title('dashed: L(C) = E + A·C^(−α)', fontsize=9)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    files.write_atomic(path, lambda f: fig.savefig(f, dpi=120, format='png'))
    plt.close(fig)
    print(f"wrote {path}")
