"""tools/bench.py on a tiny model: every mode's table has a row per variant or piece, and its
numbers agree with one another (throughput from the time per step, spreads around medians, the
first variant the reference)."""

import os

import pytest

from model import QKV_MAPS, RESIDUALS
from tools import bench

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
TINY = ['--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=2', '--device=cpu',
        '--steps=1', '--repeats=3', '--warmup=1']
VARIANTS = [*RESIDUALS, *(k for k, f in QKV_MAPS.items() if f is not None)]


def test_the_step_table(char_data, capsys, tables):
    bench.main([os.path.join(ROOT, 'config', 'shakespeare_add.py'), *TINY, f'--data_dir={char_data}'])
    table = tables.cells(capsys.readouterr().out)
    assert list(table) == VARIANTS
    for variant, (params, ms, spread, tok_s, mfu, memory, saved, overhead) in table.items():
        low, high = map(float, spread.split('-'))
        assert tables.number(params) > 0 and tables.number(saved) > 0
        assert 0 < low <= tables.number(ms) <= high
        # batch 2 x block 16 per step, over a time that the table rounds to 0.1 ms (a tiny step's is near 1 ms)
        ms_low, ms_high = tables.number(ms) - 0.05, tables.number(ms) + 0.05
        assert 2 * 16 / (ms_high / 1e3) - 1 <= tables.number(tok_s) <= 2 * 16 / (ms_low / 1e3) + 1
        assert mfu == '-' and 'GiB (process)' in memory  # no peak FLOPs known for a CPU
    assert table['additive'][-1] == '+0.0%'
    saved = {v: tables.number(cells[6]) for v, cells in table.items()}
    assert saved['hc'] > 1.5 * saved['additive'] and saved['mhc'] > 1.5 * saved['additive']  # n = 4 copies of the stream


def test_the_dynamics_table_counts_the_gains_once_per_their_interval(char_data, capsys, tables):
    """bench --dynamics: each variant's record without and with the stream map's gains, and their cost per step:
    a plain record every dynamics_interval steps and the gains' extra every dynamics_gain_interval."""
    bench.main([os.path.join(ROOT, 'config', 'shakespeare_add.py'), *TINY, f'--data_dir={char_data}', '--dynamics',
                '--variants=additive,mhc', '--repeats=1', '--dynamics_interval=10', '--dynamics_gain_interval=50'])
    steps, dynamics = capsys.readouterr().out.split('| variant | a dynamics record')
    steps, dynamics = tables.cells(steps), tables.cells('| variant | a dynamics record' + dynamics)
    assert list(dynamics) == ['additive', 'mhc']
    for variant, (plain, full, overhead) in dynamics.items():
        plain, full, ms = float(plain), float(full), tables.number(steps[variant][1])
        assert 0 < plain and 0 < full
        # rounded to 0.1 ms each: the overhead's bounds from the rounded cells
        cost = lambda p, f, m: (p / 10 + (f - p) / 50) / m * 100  # noqa: E731
        low, high = cost(plain - 0.05, full - 0.05, ms + 0.05), cost(plain + 0.05, full + 0.05, ms - 0.05)
        assert min(low, high) - 0.01 <= tables.number(overhead) <= max(low, high) + 0.01


def is_ratio(cell, a, b):
    """Whether the table's ratio cell (rounded to 0.1) is a / b for the rates a and b it prints rounded to integers."""
    low, high = (a - 0.5) / (b + 0.5), (a + 0.5) / (b - 0.5)
    return low - 0.051 <= cell <= high + 0.051


def test_the_sampling_table(char_data, capsys, tables):
    bench.main([os.path.join(ROOT, 'config', 'shakespeare_add.py'), *TINY, f'--data_dir={char_data}', '--sample',
                '--sample_tokens=20'])
    table = tables.cells(capsys.readouterr().out)
    assert list(table) == VARIANTS
    for cached, uncached, speedup in table.values():
        assert tables.number(cached) > 0 and tables.number(uncached) > 0
        assert is_ratio(tables.number(speedup), tables.number(cached), tables.number(uncached))


@pytest.mark.slow
def test_the_sampling_table_with_the_compiled_step(char_data, capsys, tables):
    """--compile adds the compiled step's rate, its ratio to the eager cached one's and the time its first
    generation spent compiling, for each model (each compiled on its own)."""
    bench.main([os.path.join(ROOT, 'config', 'shakespeare_add.py'), *TINY, f'--data_dir={char_data}', '--sample',
                '--sample_tokens=20', '--variants=additive,rotation', '--compile', '--repeats=1'])
    table = tables.cells(capsys.readouterr().out)
    assert list(table) == ['additive', 'rotation']
    for cached, uncached, speedup, compiled, ratio, to_compile in table.values():
        assert tables.number(compiled) > 0 and tables.number(to_compile) > 0
        assert is_ratio(tables.number(ratio), tables.number(compiled), tables.number(cached))


def test_the_rules_table(char_data, capsys, tables):
    bench.main([os.path.join(ROOT, 'config', 'shakespeare_add.py'), *TINY, f'--data_dir={char_data}', '--rules'])
    table = tables.cells(capsys.readouterr().out)
    maps = [k for k, f in QKV_MAPS.items() if f is not None]
    assert list(table) == [f'{r} update' for r in RESIDUALS] + [
        name for k in maps for name in (f'{k} Q/K/V map, one layer', f'{k} Q/K/V maps, 1 layers batched')]
    for median, spread in table.values():
        low, high = (tables.number(v) for v in spread.split('-'))
        assert 0 < low <= tables.number(median) <= high


def test_bench_rejects_unknown_variants(char_data):
    with pytest.raises(SystemExit, match='unknown variant'):
        bench.main([os.path.join(ROOT, 'config', 'shakespeare_add.py'), *TINY, '--variants=additive,rotaton'])
    with pytest.raises(SystemExit, match=r"variant 'mhc:identity': identity is neither key=value nor a config file"):
        bench.main([os.path.join(ROOT, 'config', 'shakespeare_add.py'), *TINY, '--variants=additive,mhc:identity'])


def test_a_variant_sets_its_own_keys(char_data, capsys, tables):
    """NAME:key=value rows: a rule's options reach the variants of that rule alone; NAME:FILE.py stacks a config
    file over the variant (the rule in the modern block)."""
    bench.main([os.path.join(ROOT, 'config', 'shakespeare_add.py'), *TINY, f'--data_dir={char_data}',
                '--variants=mhc,mhc:mhc_res=identity,mhc:hc_rate=2:hc_recompute=True,mhc:config/modern.py'])
    table = tables.cells(capsys.readouterr().out)
    assert list(table) == ['mhc', 'mhc:mhc_res=identity', 'mhc:hc_rate=2:hc_recompute=True', 'mhc:config/modern.py']
    params = [tables.number(cells[0]) for cells in table.values()]
    saved = [tables.number(cells[6]) for cells in table.values()]
    assert params[1] < params[0] and params[2] < params[0]  # no H_res coefficients; 2 copies
    assert saved[2] < saved[0]
    # the modern block: no positions (16 x 16), the one layer's value embeddings (the tiny corpus's 39 characters x 16)
    # and gate (12 x 2 heads), no gains in its two norms and the last (3 x 16)
    assert params[3] - params[0] == -16 * 16 + 39 * 16 + 12 * 2 - 3 * 16


def test_bench_profile_writes_a_trace_per_variant_into_the_folder(char_data, tmp_path, tables):
    folder = tmp_path / 'traces'
    bench.main([os.path.join(ROOT, 'config', 'shakespeare_add.py'), *TINY, f'--data_dir={char_data}',
                '--variants=additive,cayley', f'--profile={folder}'])
    assert sorted(os.listdir(folder)) == ['additive.json', 'additive.md', 'cayley.json', 'cayley.md']
    assert '"traceEvents"' in (folder / 'cayley.json').read_text()
    table = (folder / 'cayley.md').read_text().splitlines()
    assert table[2] == '| operator | calls | ms a step | share |' and len(table) > 5
    shares = [tables.number(row.split('|')[-2]) for row in table[4:]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 100.5  # the top operators' shares
    assert 'aten::' in table[4] or 'aten::' in table[5]


def test_overhead_compares_each_round_with_its_own_reference():
    """A round where the machine slowed down for one variant only moves neither median."""
    reference, times = [10.0, 20.0, 30.0], [30.0, 22.0, 33.0]  # ratios 3.0, 1.1, 1.1
    assert bench.paired_overhead(times, reference) == pytest.approx(0.1)
    assert bench.paired_overhead(reference, reference) == 0
