"""Figures of runs: the command line of a tool that draws some (run_arguments), and validation
curves in one figure, the val loss (and top-1 for images) against iteration, the mean over each
group's seeds, a line per group, or the training loss for short runs (curves); and a scaling series'
final loss against compute and wall time (scaling)."""

import argparse
import statistics

from orthogpt import files, logs


def run_arguments(argv, doc, out, what, runs='out_dir of each run'):
    """The arguments of a tool that draws runs: the runs, and --out (default `out`, `what` it is)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('runs', nargs='+', help=runs)
    p.add_argument('--out', default=out, help=what)
    return p.parse_args(argv)


FEW = 5  # evaluations below which a figure of runs draws their training loss instead


def curves(groups, path, switch_at=None):
    """groups: {label: [log records of each seed]} (logs.read). The val loss (and top-1 for images)
    against iteration, the mean over each group's seeds, a line per group; where a run has fewer than
    FEW evaluations (a short run) and every run more log lines, the training loss of the log lines
    instead, so that a short run draws a curve, not one or two points; a dashed line at switch_at.
    Writes the PNG at path."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    groups = {label: runs for label, runs in groups.items() if runs}
    if not groups:
        print("no finished runs: no figure")
        return
    every = [run for runs in groups.values() for run in runs]
    few = (any(len(logs.evaluations(run)) < FEW for run in every)
           and all(len(logs.training(run)) > len(logs.evaluations(run)) for run in every))
    loss = logs.training if few else logs.evaluations
    images = any(p[2] is not None for run in every for p in logs.evaluations(run))
    fig, axes = plt.subplots(1, 2 if images else 1, figsize=(11 if images else 6, 4), squeeze=False)
    late = [[], []]  # values after the first quarter of training, which set the y range
    for label, runs in groups.items():
        for ax, col, seen, curve in zip(axes[0], (1, 2), late, (loss, logs.evaluations)):
            seen += mean_line(ax, label, [curve(run) for run in runs], col)
    names = ('training loss' if few else 'val loss', 'top-1 %')
    if few:
        axes[0][0].set_title(f"the log lines' training loss: a run evaluated fewer than {FEW} times", fontsize=9)
    for ax, name, seen in zip(axes[0], names, late):
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
    print(f"wrote {path}" + (f" (the training loss: a run evaluated fewer than {FEW} times)" if few else ''))


def mean_line(ax, label, curves, col):
    """Draws the mean over curves [(iteration, value, ...)] of those as long as the first, of column
    col; returns the means after its first quarter."""
    iters = [it for it, *_ in curves[0]]
    if not iters:
        return []
    ys = [[p[col] for p in curve] for curve in curves if len(curve) == len(iters)]
    mean = [statistics.mean(v) for v in zip(*ys)]
    ax.plot(iters, mean, label=f"{label} (n={len(ys)})", marker='.' if len(iters) < FEW else None)
    return [m for it, m in zip(iters, mean) if it >= iters[-1] / 4]


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
