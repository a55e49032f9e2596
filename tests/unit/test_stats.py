"""orthogpt/stats.py and the tables of orthogpt/results.py on hand-computed numbers: the mean ± std
of a row, the paired difference ± its standard error over the seeds both finished, the pairing of
rows with a baseline, the reach column, and the speedup protocol's interpolation in log(steps)."""

import pytest

from orthogpt import results, stats
from orthogpt.errors import UserError
from orthogpt.planning import Case, label_of
from orthogpt.sweep import Failure, Result, Row


def test_crossing_is_linear_in_log_steps():
    assert stats.crossing([(100, 3.0), (400, 2.0)], 2.5) == (pytest.approx(200), '=')
    assert stats.crossing([(100, 3.0), (400, 2.0)], 3.5) == (100, '<=')
    assert stats.crossing([(100, 3.0), (400, 2.0)], 1.5) == (400, '>')


def test_a_baseline_pairs_each_row_with_its_own_values_of_the_keys_it_does_not_name():
    rows = {}
    for name in ('a', 'b'):
        for mlp in ('standard', 'gated'):
            for opt in ('adamw', 'muon'):
                values = (('mlp', mlp), ('optimizer', opt))
                label = label_of(name, values)
                rows[label] = Row(label, Case(f'{name}.py', name, values, values, label))
    base, against = stats.baseline_of(rows, 'a optimizer=adamw')
    assert base == 'a optimizer=adamw'
    assert against['b mlp=gated optimizer=muon'] == 'a mlp=gated optimizer=adamw'
    assert against['b mlp=standard optimizer=muon'] == 'a mlp=standard optimizer=adamw'
    assert stats.baseline_of(rows, None)[1]['b mlp=gated optimizer=muon'] == 'a mlp=gated optimizer=muon'
    with pytest.raises(UserError, match="names no row"):
        stats.baseline_of(rows, 'a optimizer=sgd')


def hand_row(label, finals, length=None, ms=None, failed=0):
    """A row of config `label` whose seeds 1, 2, ... finished with these final (and best) val losses."""
    done = [Result(seed=seed, best=loss, final=loss, top1=None, top5=None, wall=None, unit='tok', rate=None, ms=ms,
                   curve=[(length or 10, loss, None)]) for seed, loss in enumerate(finals, 1)]
    case = Case(f'{label}.py', label, (), (), label)
    return Row(label if length is None else f'{label} max_iters={length}', case, length, results=done,
               failed=[Failure(f'{label}-s{len(finals) + 1 + i}', 'exit 1', 'boom') for i in range(failed)])


def test_the_analysis_and_its_table_on_hand_computed_numbers():
    """Base a: 3.0, 3.2, 3.4 over seeds 1-3 (mean 3.2, std 0.2); b: 2.9, 3.0, its seed 3 failed. Paired
    over seeds 1 and 2: -0.1, -0.2, mean -0.15, std 0.0707, standard error 0.0707 / sqrt(2) = 0.05."""
    rows = {row.label: row for row in (hand_row('a', [3.0, 3.2, 3.4]), hand_row('b', [2.9, 3.0], failed=1))}
    analysis = stats.analyse(rows, reach='3.1')
    a, b = analysis.summaries['a'], analysis.summaries['b']
    assert (a.final.mean, a.final.spread, a.final.n) == (pytest.approx(3.2), pytest.approx(0.2), 3)
    assert a.diff is None and (b.diff.mean, b.diff.spread, b.diff.n) == (pytest.approx(-0.15), pytest.approx(0.05), 2)
    assert a.reached == [10, None, None] and b.reached == [10, 10]
    text = results.table(rows, analysis, reach=True, timed=False)
    assert text.splitlines() == [
        '| run | parameters | seeds | best val loss | final val loss | Δ final vs `a` (paired, ± s.e.) '
        '| reaches 3.1000 at (per seed) |',
        '|---|---|---|---|---|---|---|',
        '| `a` | - | 3/3 | 3.2000 ± 0.2000 | 3.2000 ± 0.2000 | - | 10, not reached, not reached |',
        '| `b` | - | 2/3 | 2.9500 ± 0.0707 | 2.9500 ± 0.0707 | -0.1500 ± 0.0500 (n=2) | 10, 10 |',
        '', '- `b-s3` failed (exit 1): boom']
    with pytest.raises(UserError, match="--reach 'c' names no finished group"):
        stats.analyse(rows, reach='c')


def test_the_speedup_on_hand_computed_numbers():
    """a reaches 2.0 in 400 steps (its own target: 1x) at 20 ms/iter; b comes down from 3.0 at 100 to
    1.0 at 400: in log(steps), 2.0 lies half-way, at 200 steps, 2 s at 10 ms/iter: 2x fewer steps,
    4x less time."""
    rows = {row.label: row for row in (hand_row('a', [2.5], 100, ms=20), hand_row('a', [2.0], 400, ms=20),
                                       hand_row('b', [3.0], 100, ms=10), hand_row('b', [1.0], 400, ms=10))}
    analysis = stats.analyse(rows, by_length=True)
    a, b = analysis.speedups
    assert (a.steps, a.how, a.in_steps, a.in_time) == (pytest.approx(400), '=', pytest.approx(1), pytest.approx(1))
    assert (b.target, b.steps, b.how) == (2.0, pytest.approx(200), '=')
    assert (b.in_steps, b.time, b.in_time) == (pytest.approx(2), pytest.approx(2), pytest.approx(4))
    assert '| `b` | - | 3.0000 | 1.0000 | 2.0000 | 200 | 2.00x | 10.0 | 2 s | 4.00x |' in \
        results.speedup_table(rows, analysis, timed=True)
