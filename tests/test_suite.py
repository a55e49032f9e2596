"""suite.py --smoke: every stage of the GPU suite runs on the CPU at tiny shapes and writes its table."""

import os

import bench
import suite


def test_the_smoke_suite_writes_every_table(tmp_path, char_data, capsys):
    out = tmp_path / 'suite'
    suite.main(['--smoke', f'--out={out}', f'--shakespeare_data={char_data}'])
    printed = capsys.readouterr().out
    assert all(f"{stage}: ok" in printed for stage in suite.LIMITS), printed
    report = (out / 'suite.md').read_text()
    for stage in ('step_ddp', 'step_fsdp'):
        rows = [line for line in (out / f'{stage}.md').read_text().splitlines() if line.startswith('| ')]
        assert [r.split('|')[1].strip() for r in rows[1:]] == list(bench.variants())  # every rule, every map
    assert 'FSDP' in (out / 'step_fsdp.md').read_text()
    assert os.path.getsize(out / 'profile' / 'additive.json') > 1000
    assert '| operator | calls | ms a step | share |' in report
    assert report.count('| `shakespeare_') == 5 and '| cayley |' in (out / 'generate.md').read_text()
