"""A comparison's numbers, from its rows' finished runs (orthogpt/sweep.py reads them back): each
row's mean ± sample std over its seeds; its paired difference against a baseline row, whose runs
have the same seeds and so the same batches (and the same initial weights where two architectures
agree), as the mean ± standard error (std / sqrt(n)) of the per-seed differences over the seeds
both finished; when each seed first reached a target loss (--reach); and the speedup protocol of
nGPT (I. Loshchilov et al., arXiv:2410.01131, Sec. 3.1): the length at which a config's mean final
val loss equals the baseline's at the longest length, interpolated in log(length) between the two
lengths around it, and the longest length over it. Pure: numbers in, numbers out."""

import math
import statistics
from dataclasses import dataclass

from orthogpt.errors import UserError


@dataclass(frozen=True)
class Estimate:
    """A mean over n seeds with its spread: the sample std of the values, or the standard error of
    a paired difference; spread None for a single seed."""
    mean: float
    spread: float | None
    n: int


@dataclass
class Summary:
    """A row's numbers over its finished seeds: each None where there is none."""
    best: Estimate | None  # best val loss, mean ± std
    final: Estimate | None  # final val loss, mean ± std
    top1: Estimate | None
    top5: Estimate | None
    diff: Estimate | None  # final val loss minus its baseline's, paired by seed: mean ± s.e.
    reached: list  # per seed, the first evaluated iteration at most at the --reach target (None: never)
    rate: float | None  # the median of the runs' throughputs
    unit: str | None  # that of the last finished run
    wall: float | None  # the runs' mean wall time


@dataclass
class Speedup:
    """A case's row in the speedup table: the nGPT paper's protocol (module docstring)."""
    case: str
    params: int | None
    finals: dict  # {length: Estimate of the final val loss, or None}
    target: float  # the baseline's mean final val loss at the longest length
    steps: float  # where the case reaches the target (how: '=' interpolated, '<=' or '>' a bound)
    how: str
    in_steps: float | None  # the longest length over steps, where reached
    ms: float | None  # the median ms/iter of its runs
    time: float | None  # seconds to the target, where reached and its baseline is timed
    in_time: float | None


@dataclass
class Analysis:
    """Everything results.md reports of the rows, as numbers."""
    baseline: str  # its selector, as the table's head names it
    target: float | None  # --reach's val loss
    summaries: dict  # {row's label: Summary}
    lengths: list | None = None  # with the speedup table: its lengths and rows
    speedups: list | None = None


def analyse(rows, baseline=None, reach=None, by_length=False):
    """The Analysis of rows: their summaries against --baseline and --reach and, by_length (two
    --lengths or more), the nGPT protocol's speedups."""
    target = reach_target(rows, reach) if reach else None
    base, against = baseline_of(rows, baseline)
    summaries = {label: summary(row, rows[against[label]] if against[label] not in (None, label) else None, target)
                 for label, row in rows.items()}
    analysis = Analysis(base, target, summaries)
    if by_length:
        analysis.lengths, analysis.speedups = speedups(rows, against)
    return analysis


def estimate(values):
    """Mean ± sample std of values; None for none."""
    if not values:
        return None
    return Estimate(statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None, len(values))


def paired(row, base):
    """Row's final val loss minus base's over the seeds both finished: mean ± standard error
    (std / sqrt(n)); None for no common seed."""
    mine, theirs = ({r.seed: r.final for r in x.results} for x in (row, base))
    diffs = [mine[s] - theirs[s] for s in mine if s in theirs]
    if not diffs:
        return None
    return Estimate(statistics.mean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None,
                    len(diffs))


def mean_final(row):
    return statistics.mean(r.final for r in row.results)


def summary(row, base, target):
    """Row's Summary; base: its baseline's row (None: no paired difference); target: --reach's."""
    ok = row.results
    rates, walls = [r.rate for r in ok if r.rate], [r.wall for r in ok if r.wall is not None]
    return Summary(
        best=estimate([r.best for r in ok]), final=estimate([r.final for r in ok]),
        top1=estimate([r.top1 for r in ok if r.top1 is not None]),
        top5=estimate([r.top5 for r in ok if r.top5 is not None]),
        diff=paired(row, base) if base else None,
        reached=[] if target is None else [next((it for it, loss, _ in r.curve if loss <= target), None) for r in ok],
        rate=statistics.median_high(rates) if rates else None, unit=ok[-1].unit if ok else None,
        wall=statistics.mean(walls) if walls else None)


def reach_target(rows, reach):
    """--reach's val loss: a number, or a row's mean final val loss."""
    try:
        return float(reach)
    except ValueError:
        if reach not in rows or not rows[reach].results:
            raise UserError(f"--reach {reach!r} names no finished group; the groups: {', '.join(rows)}") from None
        return mean_final(rows[reach])


def baseline_of(rows, selector):
    """(the baseline's label, {row: the label of the baseline's row at the same length and switch
    value, or None}). selector: a config's file name, compared at each row's own --set values (the
    first config's by default), or 'CONFIG k=v ...', that config at the --set values it names and at
    each row's own values of the others."""
    name, *picks = (selector or next(iter(rows.values())).case.name).split()
    if not all('=' in p for p in picks):
        raise UserError(f"--baseline {selector!r}: write CONFIG or 'CONFIG key=value ...' (a --set value)")
    picks = dict(p.split('=', 1) for p in picks)

    def key(row):
        return tuple((k, v) for k, v in row.case.set if k not in picks), row.length, row.switch
    at = {key(row): label for label, row in rows.items()
          if row.case.name == name and picks.items() <= dict(row.case.set).items()}
    if not at:
        raise UserError(f"--baseline {selector!r} names no row; the configs: "
                        f"{', '.join(dict.fromkeys(row.case.name for row in rows.values()))}")
    against = {label: at.get(key(row)) for label, row in rows.items()}
    return ' '.join([name, *(f'{k}={v}' for k, v in picks.items())]), against


def crossing(points, target):
    """The length at which the curve through points [(length, mean final loss)] first comes down
    to target, linear in log(length) between two lengths; (value, how) with how '<=' where the
    shortest already reaches it, '>' where the longest does not."""
    points = sorted(points)
    if points[0][1] <= target:
        return points[0][0], '<='
    for (l0, y0), (l1, y1) in zip(points, points[1:]):
        if y1 <= target:
            return math.exp(math.log(l0) + (y0 - target) / (y0 - y1) * (math.log(l1) - math.log(l0))), '='
    return points[-1][0], '>'


def speedups(rows, against):
    """(the lengths, a Speedup per case whose baseline finished at the longest length)."""
    by_case = {}
    for row in rows.values():
        by_case.setdefault(row.case.label, {})[row.length] = row
    lengths = sorted({n for at in by_case.values() for n in at})
    found = [speedup(case, at, lengths[-1], rows, against) for case, at in by_case.items()]
    return lengths, [s for s in found if s]


def speedup(case, at, longest, rows, against):
    """case's Speedup from its rows at each length (at: {length: Row}); None without a target."""
    base = against[at[longest].label] if longest in at else None
    points = [(n, mean_final(row)) for n, row in at.items() if row.results]
    if base is None or not rows[base].results or not points:
        return None
    target = mean_final(rows[base])
    steps, how = crossing(points, target)
    ms, base_ms = ms_of(at.values()), ms_of([rows[against[row.label]] for row in at.values() if against[row.label]])
    known = how == '=' and ms and base_ms
    return Speedup(case, params=next(iter(at.values())).params,
                   finals={n: estimate([r.final for r in row.results]) for n, row in at.items()},
                   target=target, steps=steps, how=how, in_steps=longest / steps if how == '=' else None, ms=ms,
                   time=steps * ms / 1e3 if known else None,
                   in_time=longest * base_ms / (steps * ms) if known else None)


def ms_of(rows):
    """The median ms/iter of the rows' finished runs; None where none was timed."""
    ms = [r.ms for row in rows for r in row.results if r.ms]
    return statistics.median(ms) if ms else None
