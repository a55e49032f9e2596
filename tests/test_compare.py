"""compare.py end to end: two tiny configs x 2 seeds, resume without rerunning, the table against
the runs' own logs, and a failing run reported in the table."""

import json
import os
import re
import statistics

import pytest

import compare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ['--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=4', '--eval_iters=2',
        '--eval_interval=10', '--log_interval=5', '--max_iters=20', '--warmup_iters=2', '--device=cpu', '--compile=False']
CONFIGS = [os.path.join(ROOT, 'config', c) for c in ('shakespeare_add.py', 'shakespeare_rot.py')]


def logged(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope='module')
def compared(tmp_path_factory):
    from conftest import tiny_text
    root = tmp_path_factory.mktemp('compare')
    data = root / 'data'
    data.mkdir()
    (data / 'input.txt').write_text(tiny_text(), encoding='utf-8')
    args = [*CONFIGS, '--seeds=2', '--nproc=2', f'--out={root / "out"}', *TINY, f'--data_dir={data}']
    return root, args, compare.main(args)


def test_runs_every_config_and_seed_and_tabulates_their_logs(compared):
    root, _, groups = compared
    assert list(groups) == ['shakespeare_add', 'shakespeare_rot']
    text = (root / 'out' / 'results.md').read_text()
    for label in groups:
        runs = [root / 'out' / f'{label}-s{seed}' for seed in (1337, 1)]
        evals = [[r for r in logged(d) if 'val_loss' in r] for d in runs]
        best = [min(r['val_loss'] for r in e) for e in evals]
        final = [e[-1]['val_loss'] for e in evals]
        assert [e[-1]['iter'] for e in evals] == [20, 20]
        row = next(line for line in text.splitlines() if line.startswith(f'| `{label}`'))
        assert f"{statistics.mean(best):.4f} ± {statistics.stdev(best):.4f}" in row
        assert f"{statistics.mean(final):.4f} ± {statistics.stdev(final):.4f}" in row
        assert '| 2/2 |' in row and 'tok/s' in row
    assert best[0] != best[1], "the two seeds ran with different seeds"
    assert (root / 'out' / 'curves.png').stat().st_size > 0


def test_a_second_call_reruns_nothing(compared, capsys):
    root, args, _ = compared
    before = {d: (root / 'out' / d / 'log.jsonl').read_bytes() for d in os.listdir(root / 'out') if d.endswith(('s1337', 's1'))}
    compare.main(args)
    assert capsys.readouterr().out.count('finished before, kept') == 4
    assert all((root / 'out' / d / 'log.jsonl').read_bytes() == b for d, b in before.items())


def test_a_failing_run_is_a_row_not_a_gap(compared, tmp_path):
    root, _, _ = compared
    out = tmp_path / 'out'
    groups = compare.main([CONFIGS[0], '--seeds=1', f'--out={out}', *TINY, f'--data_dir={root / "data"}',
                           '--set=init_from=scratch,resume'])  # nothing to resume from: train.py exits 1
    assert [len(g['ok']) for g in groups.values()] == [1, 0]
    text = (out / 'results.md').read_text()
    assert '| `shakespeare_add init_from=resume` | 0/1 | - |' in text
    assert re.search(r'`shakespeare_add-init_fromresume-s1337` failed \(exit 1\): .*no checkpoint', text)


def test_config_errors_stop_before_any_run(tmp_path):
    with pytest.raises(SystemExit, match="did you mean 'max_iters'"):
        compare.main([CONFIGS[0], f'--out={tmp_path}', '--max_iter=5'])
    with pytest.raises(SystemExit, match='key=v1,v2'):
        compare.main([CONFIGS[0], f'--out={tmp_path}', '--set=seed'])
    with pytest.raises(SystemExit, match='share the folder shakespeare_add-s1337'):
        compare.main([CONFIGS[0], CONFIGS[0], f'--out={tmp_path}'])
    assert not os.listdir(tmp_path)
