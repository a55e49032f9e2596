"""bench.py on a tiny model: every mode prints its table with a row per variant or piece."""

import os

import pytest

import bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ['--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=2', '--device=cpu',
        '--steps=1', '--repeats=1', '--warmup=1']


def rows(text):
    return {line.split('|')[1].strip(): line for line in text.splitlines() if line.startswith('| ') and '---' not in line}


@pytest.mark.parametrize('mode,expect', [
    ([], ['additive', 'orthogonal', 'rotation', 'cayley', 'exp']),
    (['--sample', '--sample_tokens=20'], ['additive', 'orthogonal', 'rotation', 'cayley', 'exp']),
    (['--rules'], ['additive update', 'orthogonal update', 'rotation update', 'cayley Q/K/V map, one layer',
                   'exp Q/K/V map, one layer', 'cayley Q/K/V maps, 1 layers batched', 'exp Q/K/V maps, 1 layers batched'])])
def test_bench_tables(mode, expect, char_data, capsys):
    bench.main([os.path.join(ROOT, 'config', 'shakespeare_add.py'), *TINY, f'--data_dir={char_data}', *mode])
    table = rows(capsys.readouterr().out)
    assert set(expect) <= set(table)
    if not mode:
        assert '+0.0%' in table['additive']


def test_bench_rejects_unknown_variants(char_data):
    with pytest.raises(SystemExit, match='unknown variant'):
        bench.main([os.path.join(ROOT, 'config', 'shakespeare_add.py'), *TINY, '--variants=additive,rotaton'])


def test_bench_profile_writes_a_trace_per_variant_into_the_folder(char_data, tmp_path):
    folder = tmp_path / 'traces'
    bench.main([os.path.join(ROOT, 'config', 'shakespeare_add.py'), *TINY, f'--data_dir={char_data}',
                '--variants=additive,cayley', f'--profile={folder}'])
    assert sorted(os.listdir(folder)) == ['additive.json', 'additive.md', 'cayley.json', 'cayley.md']
    assert '"traceEvents"' in (folder / 'cayley.json').read_text()
    table = (folder / 'cayley.md').read_text().splitlines()
    assert table[2] == '| operator | calls | ms a step | share |' and len(table) > 5
    assert 'aten::' in table[4] or 'aten::' in table[5]


def test_overhead_compares_each_round_with_its_own_reference():
    """A round where the machine slowed down for one variant only moves neither median."""
    reference, times = [10.0, 20.0, 30.0], [30.0, 22.0, 33.0]  # ratios 3.0, 1.1, 1.1
    assert bench.paired_overhead(times, reference) == pytest.approx(0.1)
    assert bench.paired_overhead(reference, reference) == 0
