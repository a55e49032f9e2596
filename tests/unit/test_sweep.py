"""The experiment engine's parts that run nothing: a comparison planned into runs (their folders'
names, which a half-finished study resumes in, and the settings each run gets), a tuning grid
extended at its edge, and the order in which a second phase follows its first (a process stood in
for)."""

import json
import os
import time

import pytest

from orthogpt import launcher, planning, sweep

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
