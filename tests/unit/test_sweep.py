"""The experiment engine's parts that run nothing: a comparison planned into runs (their folders'
names, which a half-finished study resumes in, and the settings each run gets), a tuning grid
extended at its edge, and the order in which a second phase follows its first (a process stood in
for)."""

import hashlib
import json
import os
import time

import pytest

from orthogpt import compile_choice, launcher, planning, sweep
from orthogpt.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
CONFIGS = [os.path.join(ROOT, 'config', c) for c in ('shakespeare_add.py', 'shakespeare_rot.py')]


def spec_of(out, **more):
    """The Spec of `python tools/compare.py CONFIGS --seeds=1 --out=OUT`, with more set."""
    return sweep.Spec(**{**dict(configs=CONFIGS, stack=[], extra=[], seeds=1, set=[], per=[], baseline=None, nproc=1,
                                out=str(out)), **more})


def test_each_run_has_the_folder_every_compare_py_gave_it(tmp_path):
    """OUT/CONFIG-key1value1-...-sSEED: the --per settings, then the --set values, then the length;
    a switch's phases -firstITER- and -then-KEYVALUE-."""
    runs = sweep.planned(spec_of(tmp_path, seeds=2, set=['dropout=0.0,0.1'], lengths=[10, 20],
                                 per=['shakespeare_rot:learning_rate=3e-3']))
    assert [r.name for r in runs][:4] == ['shakespeare_add-dropout0.0-max_iters10-s1',
                                          'shakespeare_add-dropout0.0-max_iters10-s2',
                                          'shakespeare_add-dropout0.0-max_iters20-s1',
                                          'shakespeare_add-dropout0.0-max_iters20-s2']
    assert runs[-1].name == 'shakespeare_rot-learning_rate3e-3-dropout0.1-max_iters20-s2'
    assert runs[-1].out_dir == str(tmp_path / runs[-1].name) and runs[-1].argv[-2:] == [
        '--seed=2', f'--out_dir={tmp_path / runs[-1].name}']
    assert (runs[-1].group, runs[-1].length, runs[-1].cfg.max_iters) == (
        'shakespeare_rot learning_rate=3e-3 dropout=0.1 max_iters=20', 20, 20)
    first, second = sweep.planned(spec_of(tmp_path, configs=CONFIGS[:1], switch=['residual=orthogonal'],
                                          switch_at=10, extra=['--max_iters=20']))
    assert (first.name, first.group, first.cfg.max_iters, first.cfg.lr_decay_iters) == (
        'shakespeare_add-first10-s1', None, 10, 20)
    assert (second.name, second.after, second.group, second.cfg.residual) == (
        'shakespeare_add-then-residualorthogonal-s1', first, 'shakespeare_add → residual=orthogonal', 'orthogonal')


def test_per_sets_a_key_for_one_configs_runs_or_one_of_its_set_values(tmp_path):
    spec = spec_of(tmp_path, per=['shakespeare_rot:learning_rate=3e-3', 'shakespeare_add dropout=0.1:learning_rate=2e-3'],
                   set=['dropout=0.0,0.1'])
    rates = {r.group: r.cfg.learning_rate for r in sweep.planned(spec)}
    assert rates == {'shakespeare_add dropout=0.0': 1e-3, 'shakespeare_add learning_rate=2e-3 dropout=0.1': 2e-3,
                     'shakespeare_rot learning_rate=3e-3 dropout=0.0': 3e-3,
                     'shakespeare_rot learning_rate=3e-3 dropout=0.1': 3e-3}


def test_a_grid_is_extended_by_its_ratio_and_integers_stay_integers():
    added = {}
    grid = ['1e-3', '3e-3', '9e-3']
    for _ in range(3):
        grid = sweep.extend(grid, min(grid, key=float), added, 'lr')
    assert [float(v) for v in grid[3:]] == pytest.approx([1e-3 / 3, 1e-3 / 9])  # twice on a side at most
    assert sweep.extend(['1', '2', '4'], '1', {}, 'steps') == ['1', '2', '4']  # no 0.5
    assert sweep.extend(['2', '4', '8'], '2', {}, 'steps') == ['2', '4', '8', '1']


def test_a_second_phase_waits_until_its_first_phase_has_exited(tmp_path, monkeypatch):
    """A first phase logs its last evaluation before it writes its checkpoint: its second phase
    starts only after its process has exited (here: two polls later), from that checkpoint."""
    cfg = planning.load(['--max_iters=10'], 'first')
    first = planning.Run('first', 1, [], str(tmp_path / 'first'), cfg, case=None, group=None)
    second = planning.Run('second', 1, [], str(tmp_path / 'second'), cfg, case=None, group='second', after=first)
    os.makedirs(first.out_dir)
    (tmp_path / 'first' / 'log.jsonl').write_text(json.dumps({'iter': 10, 'val_loss': 1.0}) + '\n')

    class Saving:  # the first phase's process, still writing its checkpoint
        polls, returncode = 0, 0

        def poll(self):
            self.polls += 1
            if self.polls < 3:
                return None
            (tmp_path / 'first' / 'ckpt.pt').write_bytes(b'final checkpoint')
            return 0

    class Exited:
        returncode = 0

        def poll(self):
            return 0

    running = [launcher.Job(first, Saving(), open(os.devnull, 'w'), time.time())]
    started = []
    monkeypatch.setattr(launcher.subprocess, 'Popen', lambda argv, **kw: started.append(argv) or Exited())
    launcher.launch([second], running, 2, {}, 1, launcher.Progress([first, second], every=0))
    assert (tmp_path / 'second' / 'ckpt.pt').read_bytes() == b'final checkpoint'
    assert len(started) == 1 and '--init_from=resume' in started[0]


def probe_folder(out, name, windows_ms, wall_s, iters=40):
    """A finished probe's folder as train.py and the launcher leave it: log windows, the last evaluation, run.json."""
    folder = out / 'probes' / name
    folder.mkdir(parents=True)
    step = iters // len(windows_ms)
    lines = [dict(iter=step * (i + 1), ms_per_iter=ms) for i, ms in enumerate(windows_ms)] + [dict(iter=iters, val_loss=2.0)]
    (folder / 'log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in lines))
    (folder / 'run.json').write_text(json.dumps(dict(returncode=0, wall_s=wall_s, argv=[])))


def test_compile_auto_compiles_the_runs_longer_than_their_probes_break_even(tmp_path):
    """e = 100 ms, c = 60 ms (the windows after the first), K = (40 - 10) - 40 x (0.06 - 0.1) = 31.6 s: the break-even
    is 790 iterations, so the 1000-iteration run compiles and the 500-iteration one does not. The rotation runs' probe
    did not finish: they run as their config says. A model whose runs are all under 10 probes is not probed."""
    spec = spec_of(tmp_path, lengths=[500, 1000], extra=['--n_layer=1'])
    runs = sweep.planned(spec) + sweep.planned(spec_of(tmp_path, configs=CONFIGS[:1], extra=['--n_layer=2'],
                                                       set=['max_iters=300']))
    stem = f'shakespeare_add-{hashlib.sha1(repr(compile_choice.key_of(runs[0].cfg)).encode()).hexdigest()[:8]}'
    probe_folder(tmp_path, f'{stem}-eager', [900, 100, 90, 100], 10.0)
    probe_folder(tmp_path, f'{stem}-compiled', [30000, 60, 60, 70], 40.0)
    probed = []
    rows = compile_choice.choose(runs, 40, str(tmp_path), probed.extend)
    assert [p.name.startswith('shakespeare_rot-') for p in probed] == [True, True]
    assert [r[1:] for r in rows] == [pytest.approx((0.1, 0.06, 31.6, 790.0, 1, 2))]
    chosen = {r.name: (r.cfg.compile, r.argv[-1]) for r in runs}
    assert chosen['shakespeare_add-max_iters1000-s1'] == (True, '--compile=True')
    assert chosen['shakespeare_add-max_iters500-s1'] == (False, '--compile=False')
    assert chosen['shakespeare_rot-max_iters1000-s1'][0] is None
    assert chosen['shakespeare_add-max_iters300-s1'][0] is None
    assert f'| {stem} | 100.0 | 60.0 | 31.6 | 790 | 1 of 2 |' in (tmp_path / 'compile.md').read_text()


def test_a_forced_compile_goes_to_every_run_and_a_probe_needs_four_iterations(tmp_path):
    assert all(r.cfg.compile is False for r in sweep.planned(spec_of(tmp_path, compile='False')))
    with pytest.raises(UserError, match='--probe_iters=2: a probe needs 4 iterations'):
        spec_of(tmp_path, probe_iters=2)


def test_compile_auto_keeps_a_set_compile_and_runs_eager_where_the_compiled_probe_failed(tmp_path):
    """A --set compile=... is the user's: no probe, no change. A model whose compiled probe failed runs eager, and the
    failed probe is kept (named, not run again at the next call)."""
    runs = sweep.planned(spec_of(tmp_path, configs=CONFIGS[:1], extra=['--max_iters=1000'], set=['compile=True']))
    probed = []
    assert compile_choice.choose(runs, 40, str(tmp_path), probed.extend) == [] and probed == []
    assert runs[0].cfg.compile is True and runs[0].argv.count('--compile=True') == 1
    runs = sweep.planned(spec_of(tmp_path, configs=CONFIGS[:1], extra=['--max_iters=1000']))
    stem = f'shakespeare_add-{hashlib.sha1(repr(compile_choice.key_of(runs[0].cfg)).encode()).hexdigest()[:8]}'
    probe_folder(tmp_path, f'{stem}-eager', [900, 100, 100, 100], 10.0)
    failed = tmp_path / 'probes' / f'{stem}-compiled'
    failed.mkdir()
    (failed / 'run.json').write_text(json.dumps(dict(returncode=1, wall_s=3.0, argv=[])))
    (failed / 'stdout.log').write_text('torch._dynamo.exc.Unsupported: a graph break\n')
    compile_choice.choose(runs, 40, str(tmp_path), probed.extend)
    assert probed == [] and failed.exists()
    assert runs[0].cfg.compile is False and runs[0].argv[-1] == '--compile=False'
