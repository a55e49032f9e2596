"""tools/suite.py --smoke: every stage of the GPU suite runs on the CPU at tiny shapes and writes a
table whose numbers agree with one another; a miniseries stage without its token shards is skipped,
saying so, and so are the stages that read Tiny Shakespeare without it."""

import json
import os
import subprocess

import pytest

from model import QKV_MAPS, RESIDUALS
from orthogpt import chars
from orthogpt.errors import UserError
from tools import suite


@pytest.mark.slow
def test_the_smoke_suite_writes_every_table(tmp_path, char_data, capsys, tables):
    out = tmp_path / 'suite'
    suite.main(['--smoke', f'--out={out}', f'--shakespeare_data={char_data}'])
    printed = capsys.readouterr().out
    assert all(f"{stage}: ok" in printed for stage in suite.LIMITS), printed
    assert (out / 'kernel_check.md').read_text().startswith('1 passed')  # the kernels' tests, here interpreted
    proved = tables.cells((out / 'selfcheck.md').read_text())  # their proof, each shape class
    assert list(proved) == list(suite.PROVED)
    assert all(row == ['16', 'float32, float32', 'pass'] for row in proved.values())
    trained = tables.cells((out / 'train_check.md').read_text())  # training on them against the rules' PyTorch
    assert list(trained) == ['hc', 'mhc'] and all(row[0] == '2' and row[-1] == 'yes' for row in trained.values())
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
    assert list(runs) == [f'`shakespeare_{v} mlp={m} optimizer={o}`' for v in suite.RULES[:1]
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


def test_the_gpu_stages_that_train_compile_every_run_without_probing(tmp_path):
    """compare.py and the miniseries would probe each model eager and compiled first (--compile=auto): 24 models in
    the shakespeare stage, past its time limit. The GPU suite compiles every run, as it was measured."""
    (tmp_path / 'bpe').mkdir()
    for split in ('train', 'val'):  # found, never read
        (tmp_path / 'bpe' / f'{split}_000000.bin').write_bytes(b'')
    stages = suite.stages(str(tmp_path), False, str(tmp_path), bpe_data=str(tmp_path / 'bpe'))
    for name in ('shakespeare', 'miniseries'):
        assert isinstance(stages[name], list) and stages[name].count('--compile=True') == 1, stages[name]


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


def test_the_runbook_checks_the_kernels_before_it_times_them_and_a_failed_check_stops_it(tmp_path, monkeypatch,
                                                                                         capsys):
    """--runbook, a lent GPU's first call: the kernels' tests, their proof and training on them, then their timing,
    within 8 minutes by the stage limits (a call may run 10). A failed check skips the stages after it. Injected:
    stages that report at once, the selfcheck failing."""
    assert suite.RUNBOOK[:3] == suite.CHECKS and sum(suite.LIMITS[s] for s in suite.RUNBOOK) <= 8 * 60
    ran = []

    def run_stage(name, argv, out, limit, env=None):
        ran.append(argv[1:3])
        (tmp_path / f'{name}.md').write_text('')
        return 'failed (exit 1)' if name == 'selfcheck' else 'ok', 1.0
    monkeypatch.setattr(suite, 'run_stage', run_stage)
    suite.main(['--smoke', '--runbook', f'--out={tmp_path}'])
    assert ran == [['-m', 'pytest'], ['tools/suite.py', '--check=selfcheck']]
    printed = capsys.readouterr().out
    assert all(f"{stage}: skipped: selfcheck failed" in printed for stage in ('train_check', 'kernel_bw')), printed


def test_the_selfcheck_names_each_shape_class_that_fails_its_proof_and_fails(tmp_path, monkeypatch, capsys, tables):
    """Injected: a proof that fails for mHC-lite alone."""
    from orthogpt import hc_kernels
    monkeypatch.setattr(hc_kernels, 'VERDICTS', {})
    monkeypatch.setattr(hc_kernels, 'proof', lambda spec, *args: 'injected' if 'permutation' in spec[1] else None)
    with pytest.warns(RuntimeWarning, match=r"the kernels failed their proof \(injected\)"), \
            pytest.raises(UserError, match=r"^1 shape class\(es\) failed the kernels' proof"):
        suite.selfcheck(str(tmp_path), True)
    verdicts = {rule: row[-1] for rule, row in tables.cells(capsys.readouterr().out).items()}
    assert verdicts.pop('mhc_lite').startswith('the kernels failed their proof (injected)')
    assert set(verdicts.values()) == {'pass'}


def test_the_train_check_fails_where_the_kernels_losses_part_from_the_rules(tmp_path, monkeypatch, capsys, tables):
    """Injected: training runs whose logs say mHC on the kernels lost 1e-4 more at a step than on the PyTorch."""
    def train(argv, cwd):
        keys = dict(a[2:].split('=', 1) for a in argv if a.startswith('--'))
        off = 1e-4 if keys['residual'] == 'mhc' and keys['hc_kernels'] == 'triton' else 0.0
        os.makedirs(keys['out_dir'])
        with open(os.path.join(keys['out_dir'], 'log.jsonl'), 'w') as f:
            f.writelines(json.dumps({'iter': i, 'loss': 5.0 - i / 10 + off * (i == 2)}) + '\n'
                         for i in range(1, int(keys['max_iters']) + 1))
        return subprocess.CompletedProcess(argv, 0)
    monkeypatch.setattr(suite.subprocess, 'run', train)
    with pytest.raises(UserError, match=r"^mhc trained on the kernels part from the rules' PyTorch by more than 1e-05"):
        suite.train_check(str(tmp_path), True)
    rows = tables.cells(capsys.readouterr().out)
    assert rows['hc'] == ['2', '4.9000', '4.8000', '0.0e+00', 'yes'] and rows['mhc'][-2:] == ['2.1e-05', 'no']
