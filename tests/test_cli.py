"""What a new user meets at the command line: the CPU estimate and hint, progress bars, stopping
during an evaluation, torchrun's report of a user error, and the list of config files."""

import os
import signal
import subprocess
import sys
import time

import pytest

import checkpoint
import guards
import tasks
import train


def test_a_cpu_run_is_estimated_and_a_gpu_sized_one_pointed_at_cpu_py(run, root, capsys, monkeypatch):
    run('--max_iters=10', '--eval_interval=10', out='small')
    out = capsys.readouterr().out
    assert 'on this CPU: about 0:00:' in out and 'for 10 iterations and 2 evaluations' in out
    assert 'sized for a GPU' not in out
    monkeypatch.setattr(train, 'CPU_PATIENCE', 0)  # every config now counts as sized for a GPU
    big = run('--max_iters=10', '--eval_interval=10', config='shakespeare_rot.py', out='big')
    out = capsys.readouterr().out
    assert 'sized for a GPU (2 layers x 32, 256 tok a step) and runs on the CPU here' in out
    cpu = os.path.relpath(os.path.join(root, 'config', 'cpu.py'))
    assert f"config/shakespeare_rot.py {cpu} --n_layer=2" in out  # the same command, config/cpu.py stacked
    assert out.index('sized for a GPU') < out.index('step 0:')  # before the first evaluation
    assert checkpoint.load(big / 'ckpt.pt')['iter_num'] == 10  # then it did what it was asked
    run('--max_iters=10', '--eval_interval=10', config='cpu.py', out='stacked')
    assert 'lower max_iters, or the model size' in capsys.readouterr().out


def test_the_estimate_changes_nothing(run, logs, monkeypatch):
    args = ['--max_iters=20', '--eval_interval=10', '--dropout=0.1', '--ortho_prob=0.5']
    timed = run(*args, config='shakespeare_ortho.py', out='timed')
    monkeypatch.setattr(train.Run, 'estimate', lambda self, argv: None)
    untimed = run(*args, config='shakespeare_ortho.py', out='untimed')
    strip = lambda d: [{k: v for k, v in r.items() if 'loss' in k or k == 'iter'} for r in logs.records(d)]  # noqa: E731
    assert strip(timed) == strip(untimed)


def test_evaluation_shows_progress_when_it_takes_time(run, capsys, monkeypatch):
    run('--max_iters=5', '--eval_interval=5', out='quick')
    assert 'evaluating' not in capsys.readouterr().err  # quick work prints no bar
    monkeypatch.setattr(tasks, 'PROGRESS_DELAY', 0)
    run('--max_iters=5', '--eval_interval=5', out='slow')
    err = capsys.readouterr().err
    assert 'evaluating train' in err and 'evaluating val' in err and '/4 [' in err


def test_a_signal_during_an_evaluation_stops_it_and_resume_runs_it_again(run, logs, capsys, monkeypatch):
    """SIGTERM arrives in the third batch of the evaluation at iteration 20: the evaluation stops
    at the next batch, the 20 iterations are saved, and the resumed run evaluates at 20 first, so
    its log is the uninterrupted run's."""
    args = ['--max_iters=40', '--eval_interval=20', '--eval_iters=8']
    full = run(*args, out='full')
    calls, check = [], guards.Interrupt.check

    def check_and_signal(self, ddp, device):
        calls.append(1)
        if len(calls) == 2 * 8 + 3:  # after the 16 batches of the evaluation at iteration 0
            os.kill(os.getpid(), signal.SIGTERM)
        return check(self, ddp, device)
    monkeypatch.setattr(guards.Interrupt, 'check', check_and_signal)
    part = run(*args, out='part')
    assert len(calls) == 2 * 8 + 3  # stopped at the check right after the signal: no further batch
    assert 'stopped by SIGTERM during the evaluation at iteration 20; checkpoint saved' in capsys.readouterr().out
    assert checkpoint.load(part / 'ckpt.pt')['iter_num'] == 20
    monkeypatch.undo()
    run(*args, '--init_from=resume', out='part')
    losses = lambda d: [{k: v for k, v in r.items() if 'loss' in k or k in ('iter', 'lr')} for r in logs.records(d)]  # noqa: E731
    assert losses(part) == losses(full)


def test_sigterm_stops_a_long_evaluation_within_seconds(root, tiny, char_data, tmp_path):
    cmd = [sys.executable, 'train.py', 'config/shakespeare_add.py', *tiny, f'--data_dir={char_data}',
           f'--out_dir={tmp_path / "out"}', '--eval_iters=1000000']  # an evaluation of hours
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED='1'))
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith('on this CPU'):  # printed just before the first evaluation
            break
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    t0 = time.perf_counter()
    lines += proc.stdout.readlines()
    assert proc.wait(timeout=30) == 0, ''.join(lines)
    assert time.perf_counter() - t0 < 5
    assert 'stopped by SIGTERM during the evaluation at iteration 0; nothing new to save' in lines[-1]


def test_torchrun_ends_with_the_users_error(torchrun, tmp_path):
    done = torchrun(1, '--dataset=openwebtext', f'--data_dir={tmp_path}', '--device=cpu', timeout=120)
    assert done.returncode != 0
    last = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-3:]
    assert any("error: dataset 'openwebtext' is not prepared" in line for line in last), '\n'.join(last)


@pytest.mark.parametrize('name,first', [('does_not_exist.py', None), ('shakespeare_rott.py', 'shakespeare_rot.py')])
def test_a_missing_config_file_lists_the_config_files_closest_first(root, name, first):
    with pytest.raises(SystemExit) as e:
        train.main([os.path.join(root, 'config', name)])
    listed = str(e.value).split('closest first:')[1].split()
    configs = sorted(f for f in os.listdir(os.path.join(root, 'config')) if f.endswith('.py') and f != '__init__.py')
    assert sorted(os.path.basename(f) for f in listed) == configs
    if first:
        assert os.path.basename(listed[0]) == first
