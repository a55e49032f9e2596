"""tools/suite.py --smoke: every stage of the GPU suite runs on the CPU at tiny shapes and writes a
table whose numbers agree with one another; a miniseries stage without its token shards is skipped,
saying so, and so are the stages that read Tiny Shakespeare without it."""

import json
import os

import pytest

from model import QKV_MAPS, RESIDUALS
from orthogpt import chars
from tools import suite


def test_the_smoke_suite_writes_every_table(tmp_path, char_data, capsys, tables):
    out = tmp_path / 'suite'
    suite.main(['--smoke', f'--out={out}', f'--shakespeare_data={char_data}'])
    printed = capsys.readouterr().out
    assert all(f"{stage}: ok" in printed for stage in suite.LIMITS), printed
    assert (out / 'kernel_check.md').read_text().startswith('1 passed')  # the kernels' tests, here interpreted
    variants = [*RESIDUALS, *(k for k, f in QKV_MAPS.items() if f is not None)]
    tokens = 2 * 16  # batch 2 x block 16 a step
    for stage in ('step_ddp', 'step_fsdp'):
        table = tables.cells((out / f'{stage}.md').read_text())
        assert list(table) == variants  # every rule, every map
        for params, ms, spread, tok_s, *_ in table.values():
            assert tables.number(tok_s) == pytest.approx(tokens / (tables.number(ms) / 1e3), rel=0.05)
    assert 'FSDP' in (out / 'step_fsdp.md').read_text() and 'FSDP' not in (out / 'step_ddp.md').read_text()
    assert os.path.getsize(out / 'profile' / 'additive.json') > 1000
    assert list(tables.cells((out / 'step_modern.md').read_text())) == list(suite.MODERN)
    micro = tables.cells((out / 'microbatch.md').read_text())  # 4 sequences a step, 2 x 2 and 4 x 1
    assert list(micro) == [f'additive:batch_size={b}:gradient_accumulation_steps={4 // b}' for b in (2, 4)]
    assert [tables.number(tok_s) for _, _, _, tok_s, *_ in micro.values()] == pytest.approx(
        [4 * 16 / (tables.number(ms) / 1e3) for _, ms, *_ in micro.values()], rel=0.05)
    operators = tables.cells((out / 'profile' / 'additive.md').read_text())
    assert len(operators) == 15 and 0 < sum(tables.number(share) for _, _, share in operators.values()) <= 100.5
    speeds = tables.cells((out / 'generate.md').read_text())
    assert list(speeds) == variants and all(tables.number(cached) > 0 for cached, _, _ in speeds.values())
    assert list(tables.cells((out / 'decode.md').read_text())) == ['additive', 'mhc']
    assert list(tables.cells((out / 'decode_gpt2.md').read_text())) == ['additive']
    runs = tables.cells((out / 'shakespeare.md').read_text())
    assert list(runs) == [f'`shakespeare_{v} mlp={m} optimizer={o}`' for v in suite.RULES[:2]
                          for m in ('standard', 'gated') for o in ('adamw', 'muon')]
    assert all(seeds == '1/1' and 0 < tables.number(best) < 5 for _, seeds, best, *_ in runs.values())  # ln(39) ~ 3.7
    series = tables.cells((out / 'miniseries.md').read_text())  # its last row of each rule: the fit's
    assert list(series)[-2:] == [f'`shakespeare_{v}`' for v in suite.SERIES[:2]]
    data = json.loads((out / 'miniseries' / 'miniseries.json').read_text())
    assert [[s['depth'] for s in data['rules'][f'shakespeare_{v}']['sizes']] for v in suite.SERIES[:2]] == [[1, 2, 3]] * 2
    assert (out / 'miniseries' / 'miniseries.png').stat().st_size > 0
    report = (out / 'suite.md').read_text()
    assert all(f"## {stage}" in report for stage in suite.LIMITS)


def test_the_miniseries_stage_without_token_shards_is_skipped_saying_how_to_prepare_them(tmp_path):
    why = suite.miniseries(str(tmp_path), False, str(tmp_path / 'none'))
    assert why.startswith('skipped: ') and 'python data/prepare_text.py --dataset fineweb-edu' in why
    argv = suite.stages(str(tmp_path), True, None)['miniseries']
    assert argv[1] == 'tools/miniseries.py' and '--depths=1,2,3' in argv


def test_the_stages_that_read_tiny_shakespeare_are_skipped_without_it_saying_what_to_carry(tmp_path, monkeypatch,
                                                                                            capsys, tiny_text):
    """A lent GPU machine has no network and none of the repository's ignored files: the stages that read Tiny
    Shakespeare say so and what to do, at once, and the others run. Injected: a download address that refuses."""
    monkeypatch.setattr(chars, 'URL', 'http://127.0.0.1:9/input.txt')
    text = tmp_path / 'text'
    text.mkdir()
    suite.main(['--smoke', f'--out={tmp_path / "out"}', f'--shakespeare_data={text}', '--stages=decode,decode_gpt2'])
    printed = capsys.readouterr().out
    assert f"decode: skipped: no Tiny Shakespeare in {text} (could not download Tiny Shakespeare" in printed
    assert 'carry data/shakespeare_char/input.txt' in printed and '--shakespeare_data=DIR' in printed
    assert 'decode_gpt2: ok' in printed
    commands = suite.stages(str(tmp_path / 'out'), True, str(text), chosen=['generate'])
    assert all(commands[s].startswith('skipped: ') for s in ('generate', 'decode', 'shakespeare'))
    assert suite.stages(str(tmp_path / 'out'), True, str(text), chosen=['kernel_bw'])['decode'][1] == 'tools/bench.py'
    (text / 'input.txt').write_text(tiny_text, encoding='utf-8')  # with its text, prepared before any stage runs
    assert suite.stages(str(tmp_path / 'out'), True, str(text), chosen=['decode'])['decode'][1] == 'tools/bench.py'
    assert json.loads((text / 'meta.json').read_text())['vocab_size'] == len(set(tiny_text))
    (text / 'train.bin').unlink()  # half a preparation: prepared again, as train.py would
    assert suite.stages(str(tmp_path / 'out'), True, str(text), chosen=['decode'])['decode'][1] == 'tools/bench.py'
    assert (text / 'train.bin').stat().st_size == 2 * int(0.9 * len(tiny_text))
