"""A comparison's results.md: the command, the tuning table (with --tune), the protocol of a
switch, a row per config x setting (x length, x switch value) with its parameters, its best and
final val loss as mean ± std, its paired difference against the baseline (and when each seed
reached --reach's loss, and its speed where the runs ran one at a time), the runs that did not
finish named under it, and the speedup table (with two --lengths or more). Text from
orthogpt/stats.py's numbers; tools/miniseries.py's tables share its Markdown."""

import math

from orthogpt.planning import TUNING_SEED


def markdown(head, body):
    """The lines of a markdown table."""
    return ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head),
            *('| ' + ' | '.join(cells) + ' |' for cells in body)]


def shown(e, fmt):
    """An Estimate as 'mean ± std' (or the value alone, for one seed); '-' for none."""
    if e is None:
        return '-'
    return fmt.format(e.mean) if e.spread is None else f"{fmt.format(e.mean)} ± {fmt.format(e.spread)}"


def shown_diff(e):
    if e is None:
        return '-'
    return f"{e.mean:+.4f} (n=1)" if e.spread is None else f"{e.mean:+.4f} ± {e.spread:.4f} (n={e.n})"


def table(rows, analysis, reach=False, timed=True):
    """The results table: parameters, best and final val loss, the paired difference of the final
    one against the baseline; with reach a column of when each seed first reached the target;
    timed: the runs' throughput and wall time. The failed runs are named under it."""
    images = any(s.top1 is not None for s in analysis.summaries.values())
    head = ['run', 'parameters', 'seeds', 'best val loss', 'final val loss'] + \
        (['top-1 %', 'top-5 %'] if images else []) + [f"Δ final vs `{analysis.baseline}` (paired, ± s.e.)"] + \
        ([f"reaches {analysis.target:.4f} at (per seed)"] if reach else []) + \
        (['throughput (median)', 'wall time (mean)'] if timed else [])
    body = [row_cells(row, analysis.summaries[label], images, reach, timed) for label, row in rows.items()]
    notes = [f"- `{f.name}` failed ({f.why}): {f.tail}" for row in rows.values() for f in row.failed]
    return '\n'.join(markdown(head, body) + ([''] + notes if notes else [])) + '\n'


def row_cells(row, s, images, reach, timed):
    """A row's cells of the results table, s being its Summary."""
    n = len(row.results)
    cells = [f"`{row.label}`", f"{row.params:,}" if row.params else '-', f"{n}/{n + len(row.failed)}",
             shown(s.best, '{:.4f}'), shown(s.final, '{:.4f}')]
    if images:
        cells += [shown(s.top1, '{:.2f}'), shown(s.top5, '{:.2f}')]
    cells.append(shown_diff(s.diff))
    if reach:
        cells.append(', '.join('not reached' if it is None else str(it) for it in s.reached) or '-')
    if timed:
        cells += [f"{s.rate:,.0f} {s.unit}/s" if s.rate else '-', f"{s.wall:.0f} s" if s.wall is not None else '-']
    return cells


def tuning_table(losses, picked):
    """Each tuning run's final val loss ({label: loss}), the chosen setting of each case (picked) in bold."""
    body = []
    for label, loss in losses.items():
        cell = f"{loss:.4f}" if math.isfinite(loss) else 'failed or not finite'
        body.append([f"`{label}`", f"**{cell}**" if label in picked else cell])
    return '\n'.join(markdown([f'tuning run (seed {TUNING_SEED})', 'final val loss'], body)) + '\n'


def speedup_table(rows, analysis, timed):
    """The nGPT paper's protocol (orthogpt/stats.py): the steps (and time) at which each case's mean
    final val loss reaches the baseline's at the longest length."""
    lengths, name = analysis.lengths, analysis.baseline
    longest = lengths[-1]
    head = ['method', 'parameters'] + [f"final val loss, {n} steps" for n in lengths] + \
        [f'baseline at {longest}', 'steps to it', 'speedup in steps'] + \
        (['ms/iter', 'time to it', 'speedup in time'] if timed else [])
    whose = " (at the row's --set values)" if ' ' not in name and any(row.case.set for row in rows.values()) else ''
    body = []
    for s in analysis.speedups:
        steps = {'<=': f"≤ {s.steps:.0f}", '=': f"{s.steps:.0f}", '>': f"> {s.steps:.0f} (not reached)"}[s.how]
        cells = [f"`{s.case}`", f"{s.params:,}" if s.params else '-',
                 *(shown(s.finals.get(n), '{:.4f}') for n in lengths), f"{s.target:.4f}", steps, '-' if s.in_steps is None else f"{s.in_steps:.2f}x"]
        if timed:
            cells += [f"{s.ms:.1f}" if s.ms else '-', '-' if s.time is None else f"{s.time:.0f} s",
                      '-' if s.in_time is None else f"{s.in_time:.2f}x"]
        body.append(cells)
    return '\n'.join([f"Target of each row: the final val loss of `{name}`{whose} at {longest} steps, mean over seeds.",
                      '', *markdown(head, body)]) + '\n'


def report(spec, command, rows, analysis, tuning, picked):
    """results.md: the command, the tuning table, what the runs' protocol and timing were, the
    results table and, with two --lengths or more, the speedup table."""
    timed = spec.nproc == 1 and spec.launcher == 'local'
    protocol = '' if not spec.switch else (
        f"Second phases continue their first phase's checkpoint from iteration {spec.switch_at} "
        + ("with a fresh optimizer and learning-rate schedule.\n\n" if spec.switch_reset
           else "with its optimizer state and learning-rate schedule.\n\n"))
    reach = '' if not spec.reach else (
        f"The reach column: the first evaluation at which each seed's val loss is at most "
        f"{analysis.target:.4f} (`{spec.reach}`).\n\n")
    untimed = ('' if timed else f"The {spec.nproc} runs at a time shared the machine: nothing is timed.\n\n"
               if spec.launcher == 'local' else "The runs ran as Slurm jobs, on whatever nodes: nothing is timed.\n\n")
    return (f"`{command}`\n\n" + (tuning_table(tuning, picked) + '\n' if tuning else '') + protocol + reach + untimed
            + table(rows, analysis, bool(spec.reach), timed)
            + ('\n' + speedup_table(rows, analysis, timed) if analysis.speedups is not None else ''))
