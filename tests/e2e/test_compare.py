"""compare.py end to end: two tiny configs x 2 seeds, resume without rerunning, the table against
the runs' own logs, a failing run reported in the table, one comparison per folder, whose runs
stop with it, tuning, the speedup protocol and the switch. The engine's parts that run nothing
(planning, the statistics, the tables) are tested in tests/unit/test_sweep.py and test_stats.py."""

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from orthogpt import checkpoint, launcher, stats, sweep
from orthogpt import logs as logs_module
from tools import compare

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
TINY = ['--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=4', '--eval_iters=2',
        '--eval_interval=10', '--log_interval=5', '--max_iters=20', '--warmup_iters=2', '--device=cpu', '--compile=False']
CONFIGS = [os.path.join(ROOT, 'config', c) for c in ('shakespeare_add.py', 'shakespeare_rot.py')]


# session scope: xdist's worksteal may leave a module and come back to it, which builds a module's fixture anew
@pytest.fixture(scope='session')
def compared(tmp_path_factory, tiny_text):
    root = tmp_path_factory.mktemp('compare')
    data = root / 'data'
    data.mkdir()
    (data / 'input.txt').write_text(tiny_text, encoding='utf-8')
    args = [*CONFIGS, '--seeds=2', '--nproc=2', f'--out={root / "out"}', *TINY, f'--data_dir={data}']
    return root, args, compare.main(args)


def test_runs_every_config_and_seed_and_tabulates_their_logs(compared, logs):
    root, _, rows = compared
    assert list(rows) == ['shakespeare_add', 'shakespeare_rot']
    text = (root / 'out' / 'results.md').read_text()
    for label in rows:
        runs = [root / 'out' / f'{label}-s{seed}' for seed in (1, 2)]
        evals = [[r for r in logs.records(d) if 'val_loss' in r] for d in runs]
        best = [min(r['val_loss'] for r in e) for e in evals]
        final = [e[-1]['val_loss'] for e in evals]
        assert [e[-1]['iter'] for e in evals] == [20, 20]
        row = next(line for line in text.splitlines() if line.startswith(f'| `{label}`'))
        assert f"{statistics.mean(best):.4f} ± {statistics.stdev(best):.4f}" in row
        assert f"{statistics.mean(final):.4f} ± {statistics.stdev(final):.4f}" in row
        assert '| 2/2 |' in row and 'tok/s' not in row  # two runs at a time: nothing timed
    assert best[0] != best[1], "the two seeds ran with different seeds"
    assert 'shared the machine: nothing is timed' in text
    finals = {label: [[r for r in logs.records(root / 'out' / f'{label}-s{seed}') if 'val_loss' in r][-1]['val_loss']
                      for seed in (1, 2)] for label in rows}
    diffs = [b - a for a, b in zip(finals['shakespeare_add'], finals['shakespeare_rot'])]
    row = next(line for line in text.splitlines() if line.startswith('| `shakespeare_rot`'))
    assert f"{statistics.mean(diffs):+.4f} ± {statistics.stdev(diffs) / 2 ** 0.5:.4f} (n=2)" in row  # paired, s.e.
    assert (root / 'out' / 'curves.png').stat().st_size > 0


@pytest.mark.slow
def test_tuning_picks_on_seed_1337_extends_an_edge_and_reports_the_other_seeds(compared, logs, tmp_path):
    root, _, _ = compared
    out = tmp_path / 'tune'
    rows = compare.main([CONFIGS[0], '--seeds=2', f'--out={out}', *TINY, f'--data_dir={root / "data"}',
                         '--tune', 'learning_rate=1e-4,2e-4'])
    tried = sorted(d for d in os.listdir(out) if d.endswith('-s1337'))
    finals = {d: [r for r in logs.records(out / d) if 'val_loss' in r][-1]['val_loss'] for d in tried}
    assert len(tried) >= 3  # the best of 1e-4 and 2e-4 lay on the grid's edge: 4e-4 was tried too (and on)
    best = min(finals, key=finals.get)
    value = best.split('learning_rate')[1].rsplit('-s', 1)[0]
    assert list(rows) == [f'shakespeare_add learning_rate={value}']
    assert sorted(d for d in os.listdir(out) if d.startswith(f'shakespeare_add-learning_rate{value}-s')) == [
        f'shakespeare_add-learning_rate{value}-s{s}' for s in (1, 1337, 2)]  # reported on 1 and 2 alone
    assert [r.seed for r in rows[f'shakespeare_add learning_rate={value}'].results] == [1, 2]
    assert f"**{finals[best]:.4f}**" in (out / 'results.md').read_text()


@pytest.mark.slow
def test_the_speedup_protocol_interpolates_the_length_that_reaches_the_baseline(compared, logs, tmp_path):
    """Complete runs of 10 and 20 steps (each its own schedule); the target is additive's mean final
    loss at 20; each rule's steps to it, interpolated in log(steps), and the speedup, from the logs."""
    root, _, _ = compared
    out = tmp_path / 'speed'
    compare.main([*CONFIGS, '--seeds=2', f'--out={out}', *TINY, f'--data_dir={root / "data"}', '--lengths=10,20'])
    final = {(c, n): statistics.mean([r for r in logs.records(out / f'shakespeare_{c}-max_iters{n}-s{s}')
                                      if 'val_loss' in r][-1]['val_loss'] for s in (1, 2))
             for c in ('add', 'rot') for n in (10, 20)}
    target = final['add', 20]
    text = (out / 'results.md').read_text()
    row = next(line for line in text.splitlines() if line.startswith('| `shakespeare_rot` |'))
    steps, how = stats.crossing([(10, final['rot', 10]), (20, final['rot', 20])], target)
    shown = {'<=': f"≤ {steps:.0f}", '=': f"{steps:.0f}", '>': f"> {steps:.0f} (not reached)"}[how]
    assert f"| {target:.4f} | {shown} |" in row and 'ms/iter' in text  # one run at a time: timed


def test_reach_reports_when_each_seed_first_reached_a_groups_final_loss(compared, logs):
    root, args, _ = compared
    compare.main(args + ['--reach=shakespeare_add'])
    finals = [[r for r in logs.records(root / 'out' / f'shakespeare_add-s{s}') if 'val_loss' in r][-1]['val_loss']
              for s in (1, 2)]
    target = statistics.mean(finals)
    text = (root / 'out' / 'results.md').read_text()
    assert f"reaches {target:.4f} at (per seed)" in text
    for label in ('shakespeare_add', 'shakespeare_rot'):
        firsts = [next((r['iter'] for r in logs.records(root / 'out' / f'{label}-s{s}') if r.get('val_loss', 9) <= target),
                       None) for s in (1, 2)]
        row = next(line for line in text.splitlines() if line.startswith(f'| `{label}`'))
        assert f"| {', '.join('not reached' if f is None else str(f) for f in firsts)} |" in row
    with pytest.raises(SystemExit, match="--reach 'nope' names no finished group"):
        compare.main(args + ['--reach=nope'])
    compare.main(args + [f'--reach={target}'])  # a val loss given as a number: the same column
    assert f"reaches {target:.4f} at (per seed)" in (root / 'out' / 'results.md').read_text()


def test_a_second_call_reruns_nothing(compared, capsys):
    root, args, _ = compared
    before = {d: (root / 'out' / d / 'log.jsonl').read_bytes() for d in os.listdir(root / 'out') if d.endswith(('-s1', '-s2'))}
    compare.main(args)
    assert capsys.readouterr().out.count('finished before, kept') == 4
    assert all((root / 'out' / d / 'log.jsonl').read_bytes() == b for d, b in before.items())
    with pytest.raises(SystemExit, match=r'holds a run of another config \(weight_decay: 0.05 here, 0.0 there\)'):
        compare.main(args + ['--weight_decay=0.05'])  # the same folders, other runs: never taken for them
    capsys.readouterr()
    compare.main(args + ['--weight_decay=0.0'])  # other arguments, the same config: the runs serve
    assert capsys.readouterr().out.count('finished before, kept') == 4


def test_a_failing_run_is_a_row_not_a_gap(compared, tmp_path):
    root, _, _ = compared
    out = tmp_path / 'out'
    rows = compare.main([CONFIGS[0], '--seeds=1', f'--out={out}', *TINY, f'--data_dir={root / "data"}',
                         '--set=init_from=scratch,resume'])  # nothing to resume from: train.py exits 1
    assert [len(row.results) for row in rows.values()] == [1, 0]
    text = (out / 'results.md').read_text()
    assert '| `shakespeare_add init_from=resume` | - | 0/1 | - |' in text  # no run started: no parameter count
    assert re.search(r'`shakespeare_add-init_fromresume-s1` failed \(exit 1\): .*no checkpoint', text)


def test_progress_lines_then_sigterm_stops_the_runs_with_their_checkpoints(compared, tmp_path):
    """While a run trains, compare.py prints a progress line (every --progress seconds) with the runs done, the
    running one's iteration and the time left at the recent speed. A scheduler's SIGTERM reaches compare.py alone;
    it passes it on and waits for the runs."""
    root, _, _ = compared
    out = tmp_path / 'out'
    cmd = [sys.executable, os.path.join(ROOT, 'tools', 'compare.py'), CONFIGS[0], '--seeds=1', f'--out={out}', *TINY,
           f'--data_dir={root / "data"}', '--max_iters=100000', '--progress=1']
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, lines = time.time() + 300, []
    for line in proc.stdout:  # a line a second: the deadline is looked at
        lines.append(line)
        if ' left at the recent speed' in line or time.time() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    printed = ''.join(lines) + proc.communicate(timeout=60)[0]
    progress = [line for line in lines if line.startswith('progress: ')]
    assert re.fullmatch(r'progress: 0/1 runs done; shakespeare_add-s1 at iteration \d+ of 100000; about '
                        r'(\d+ h \d\d min|\d+ min \d\d s|\d+ s) left at the recent speed\n', progress[-1]), printed
    assert proc.returncode == 1 and 'the same command resumes the unfinished runs' in printed
    assert 'stopped by SIGTERM' in (out / 'shakespeare_add-s1' / 'stdout.log').read_text()
    assert (out / 'shakespeare_add-s1' / 'ckpt.pt').exists()


def test_a_second_comparison_is_refused_and_a_killed_ones_runs_save_and_stop(compared, tmp_path, processes):
    """compare.py started twice on one --out: the second is refused at once, naming the first. The
    first SIGKILLed: its run gets SIGTERM (prctl's parent-death signal), saves and stops, and the
    next compare.py resumes it."""
    root, _, _ = compared
    out = tmp_path / 'out'
    args = [CONFIGS[0], '--seeds=1', f'--out={out}', *TINY, f'--data_dir={root / "data"}']
    first = subprocess.Popen([sys.executable, os.path.join(ROOT, 'tools', 'compare.py'), *args, '--max_iters=100000'],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS='1'))
    run = out / 'shakespeare_add-s1'
    deadline = time.time() + 120
    while not any('loss' in r for r in logs_module.read(str(run))) and time.time() < deadline:  # training
        time.sleep(0.2)
    runs = processes.descendants(first.pid)
    try:
        with pytest.raises(SystemExit, match=f"{out} is in use by another run: pid {first.pid} on .*tools/compare.py"):
            compare.main(args)
        first.kill()
        processes.wait_gone(runs, 30)
    except BaseException:  # what is left, if the test failed
        processes.kill_all([first.pid, *runs])
        raise
    finally:
        first.wait()
    # the signal may come between two steps or during an evaluation (every 10 iterations here)
    assert re.search(r'stopped by SIGTERM (during the evaluation )?at iteration', (run / 'stdout.log').read_text())
    k = checkpoint.load(run / 'ckpt.pt')['iter_num']
    rows = compare.main([*args, f'--max_iters={k + 10}'])
    assert [r.seed for r in rows['shakespeare_add'].results] == [1]
    assert logs_module.evaluations(logs_module.read(str(run)))[-1][0] == k + 10


def test_config_errors_stop_before_any_run(tmp_path):
    with pytest.raises(SystemExit, match="did you mean 'max_iters'"):
        compare.main([CONFIGS[0], f'--out={tmp_path}', '--max_iter=5'])
    with pytest.raises(SystemExit, match='key=v1,v2'):
        compare.main([CONFIGS[0], f'--out={tmp_path}', '--set=seed'])
    with pytest.raises(SystemExit, match='share the folder shakespeare_add-s1'):
        compare.main([CONFIGS[0], CONFIGS[0], f'--out={tmp_path}'])
    with pytest.raises(SystemExit, match="--per 'shakespeare_rot:learning_rate=1e-3' selects no run"):
        compare.main([CONFIGS[0], f'--out={tmp_path}', '--per=shakespeare_rot:learning_rate=1e-3'])
    with pytest.raises(SystemExit, match="--per 'shakespeare_add dropout=0.5:learning_rate=1e-3' selects no run"):
        compare.main([CONFIGS[0], f'--out={tmp_path}', '--set=dropout=0.0,0.1',
                      '--per=shakespeare_add dropout=0.5:learning_rate=1e-3'])
    with pytest.raises(SystemExit, match='write --per CONFIG:key=value'):
        compare.main([CONFIGS[0], f'--out={tmp_path}', '--per=:learning_rate=1e-3'])
    assert not os.listdir(tmp_path)


@pytest.fixture(scope='session')
def switched(compared):
    """[Oh] Sec. 4.3 on tiny runs: additive for 10 iterations, then additive or orthogonal to 20
    with a fresh optimizer and schedule."""
    root, _, _ = compared
    args = [CONFIGS[0], '--seeds=1', '--nproc=2', f'--out={root / "switch"}', *TINY, f'--data_dir={root / "data"}',
            '--switch', 'residual=additive,orthogonal', '--switch_at=10', '--switch_reset']
    return root / 'switch', compare.main(args)


def test_a_switch_continues_one_first_phase_once_per_value(switched, logs):
    out, rows = switched
    assert list(rows) == ['shakespeare_add → residual=additive', 'shakespeare_add → residual=orthogonal']
    assert sorted(os.listdir(out)) == ['curves.png', 'results.md', 'shakespeare_add-first10-s1',
                                       'shakespeare_add-then-residualadditive-s1',
                                       'shakespeare_add-then-residualorthogonal-s1']
    first = logs.records(out / 'shakespeare_add-first10-s1')
    assert first[-1]['iter'] == 10 and 'val_loss' in first[-1]
    for value in ('additive', 'orthogonal'):
        second = logs.records(out / f'shakespeare_add-then-residual{value}-s1')
        assert second[:len(first)] == first, "the second phase's log starts with its first phase's"
        resume = second[len(first)]
        assert resume['event'] == 'resume' and resume['reset_optimizer'] is True
        assert resume['changes'].get('residual') == (None if value == 'additive' else ['additive', 'orthogonal'])
        lr = {r['iter']: r['lr'] for r in first + second if 'lr' in r}
        assert lr[15] == lr[5], "the schedule restarts at the switch"
        assert [r['iter'] for r in second if 'val_loss' in r][-1] == 20
    assert 'fresh optimizer' in (out / 'results.md').read_text()


def test_a_resumed_second_phase_is_not_reset_again(switched, tmp_path):
    out, _ = switched
    spec = compare.parse_args([CONFIGS[0], '--seeds=1', f'--out={out}', *TINY, '--switch', 'residual=orthogonal',
                               '--switch_at=10', '--switch_reset'])
    first, second = sweep.planned(spec)
    argv, resume = launcher.start(second)  # its checkpoint is its own, from iteration 20
    assert resume and '--reset_optimizer=True' not in argv
    argv, resume = launcher.start(replace(second, out_dir=str(tmp_path)))  # a fresh copy of the first phase
    assert resume and '--reset_optimizer=True' in argv
    assert (tmp_path / 'ckpt.pt').read_bytes() == (out / first.name / 'ckpt.pt').read_bytes()


def test_a_switch_without_reset_continues_the_run_exactly(compared, logs):
    """App. C.3's protocol: the first phase stops inside the full run's schedule and the second
    resumes it, so switching to the same rule reproduces the uninterrupted run."""
    root, _, _ = compared
    out = root / 'continued'
    compare.main([CONFIGS[0], '--seeds=1', '--nproc=2', f'--out={out}', *TINY, f'--data_dir={root / "data"}',
                  '--switch', 'residual=additive', '--switch_at=10'])  # one thread per run, as in `compared`
    def untimed(run):  # its evaluations, but the training time they carry
        return [{k: v for k, v in r.items() if k not in ('train_s', 'save_s')} for r in logs.records(run)
                if 'ms_per_iter' not in r and 'event' not in r]
    assert untimed(out / 'shakespeare_add-then-residualadditive-s1') == untimed(root / 'out' / 'shakespeare_add-s1')
    assert 'with its optimizer state' in (out / 'results.md').read_text()


def test_a_failed_first_phase_is_reported_in_its_second_phases_rows(compared, tmp_path):
    root, _, _ = compared
    rows = compare.main([CONFIGS[0], '--seeds=1', f'--out={tmp_path}', *TINY, f'--data_dir={root / "data"}',
                         '--init_from=resume', '--switch', 'residual=additive,orthogonal', '--switch_at=10'])
    assert [len(row.results) for row in rows.values()] == [0, 0]
    text = (tmp_path / 'results.md').read_text()
    for value in ('additive', 'orthogonal'):
        assert re.search(rf'`shakespeare_add-then-residual{value}-s1` failed \(its first phase '
                         rf'shakespeare_add-first10-s1 did not finish, exit 1\): .*no checkpoint', text)
    assert sorted(os.listdir(tmp_path)) == ['results.md', 'shakespeare_add-first10-s1']


def test_switch_errors_stop_before_any_run(tmp_path):
    with pytest.raises(SystemExit, match="residual 'additive' -> 'rotation': the two rules build different parameters"):
        compare.main([CONFIGS[0], f'--out={tmp_path}', '--switch=residual=rotation', '--switch_at=10'])
    with pytest.raises(SystemExit, match='--switch_at=5000 must lie between 0 and max_iters=5000'):
        compare.main([CONFIGS[0], f'--out={tmp_path}', '--switch=residual=orthogonal', '--switch_at=5000'])
    with pytest.raises(SystemExit, match='go together'):
        compare.main([CONFIGS[0], f'--out={tmp_path}', '--switch=residual=orthogonal'])
    with pytest.raises(SystemExit, match='goes with neither --lengths nor --tune'):
        compare.main([CONFIGS[0], f'--out={tmp_path}', '--switch=residual=orthogonal', '--switch_at=10',
                      '--tune=learning_rate=1e-3,2e-3'])
    assert not os.listdir(tmp_path)


def test_plot_curves_reads_out_dirs_and_log_copies(tmp_path, capsys):
    from tools import plot_curves
    records = [{'iter': i, 'val_loss': 4.0 - i / 10} for i in (0, 10, 20)]
    (tmp_path / 'run-a').mkdir()
    (tmp_path / 'run-a' / 'log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
    (tmp_path / 'b.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records[:2]))
    (tmp_path / 'died.jsonl').write_text(json.dumps({'iter': 5, 'loss': 9.0}) + '\n')
    out = tmp_path / 'curves.png'
    plot_curves.main([str(tmp_path / 'run-a'), str(tmp_path / 'b.jsonl'), str(tmp_path / 'died.jsonl'), f'--out={out}'])
    printed = capsys.readouterr().out
    assert 'died.jsonl: no evaluation logged, skipped' in printed and f'wrote {out}' in printed
    assert out.stat().st_size > 0


def test_the_command_lines_are_thin():
    """compare.py and miniseries.py parse their arguments and call the engine (orthogpt/sweep.py): at most
    300 lines each."""
    for tool in ('compare.py', 'miniseries.py'):
        with open(os.path.join(ROOT, 'tools', tool)) as f:
            assert len(f.read().splitlines()) <= 300, tool


@pytest.mark.slow
def test_compile_auto_probes_each_model_and_records_each_runs_choice(compared, tmp_path):
    """--compile=auto trains a model eager and compiled for --probe_iters in OUT/probes/, then each run's config.json
    holds the choice its length and the probes' figures give (compile.md's break-even); the same command again keeps
    the runs and the probes."""
    root, _, _ = compared
    tiny = [a for a in TINY if not a.startswith(('--compile=', '--max_iters='))]
    args = [CONFIGS[0], '--seeds=1', f'--out={tmp_path}', *tiny, f'--data_dir={root / "data"}', '--probe_iters=4',
            '--set', 'max_iters=40,100']
    compare.main(args)
    row = next(line for line in (tmp_path / 'compile.md').read_text().splitlines() if line.startswith('| shakespeare'))
    even = row.split(' | ')[4]
    even = float('inf') if even == 'never' else float(even.replace(',', ''))
    for n in (40, 100):
        with open(tmp_path / f'shakespeare_add-max_iters{n}-s1' / 'config.json') as f:
            assert json.load(f)['compile'] is (n > even)
    eager, compiled = sorted((tmp_path / 'probes').iterdir(), key=lambda p: p.name.endswith('-compiled'))
    assert (eager.name, compiled.name) == (row.split(' | ')[0][2:] + '-eager', row.split(' | ')[0][2:] + '-compiled')
    for probe, flag in ((eager, False), (compiled, True)):
        with open(probe / 'config.json') as f:
            assert json.load(f)['compile'] is flag
    stamp = (compiled / 'log.jsonl').stat().st_mtime
    shutil.rmtree(tmp_path / 'shakespeare_add-max_iters40-s1')
    compare.main(args)
    assert (compiled / 'log.jsonl').stat().st_mtime == stamp  # the run again, its probes kept
    assert launcher.finished(sweep.planned(compare.parse_args(args))[0])
    assert 'compile=auto' in (tmp_path / 'results.md').read_text()
