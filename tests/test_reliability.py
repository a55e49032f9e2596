"""Stopping and resuming safely: exact resume after a real signal, checkpoint verification and
fallback, non-finite steps, switching the residual rule, and bad input."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

import checkpoint
import model as model_module
import sample
import tasks
import train

STOCHASTIC = ['--dropout=0.1', '--residual=orthogonal', '--ortho_prob=0.5', '--deterministic=True',
              '--lr_decay_iters=200', '--eval_interval=100']


def test_sigint_then_resume_is_bit_exact(logs, run, root, tiny, tmp_path, char_data):
    """A real training process gets SIGINT, saves at the next step boundary and exits 0; the
    resumed run logs exactly the losses of an uninterrupted one (dropout and stochastic
    orthogonal connections included)."""
    full = run('--max_iters=200', *STOCHASTIC, out='full')
    out = tmp_path / 'part'
    cmd = [sys.executable, 'train.py', 'config/shakespeare_add.py', *tiny, f'--data_dir={char_data}',
           f'--out_dir={out}', '--max_iters=200', *STOCHASTIC]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED='1'))
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith('iter 30:'):
            proc.send_signal(signal.SIGINT)
            break
    lines += proc.stdout.readlines()
    assert proc.wait(timeout=60) == 0, ''.join(lines)
    stopped = [line for line in lines if line.startswith('stopped by SIGINT')]
    assert stopped, ''.join(lines)
    k = int(stopped[0].split('iteration ')[1].split(';')[0])
    assert 30 <= k < 200 and checkpoint.load(out / 'ckpt.pt')['iter_num'] == k
    run('--max_iters=200', '--init_from=resume', *STOCHASTIC, out='part')
    assert logs.losses(out) == logs.losses(full)


def test_rng_state_round_trip_covers_numpy_and_python():
    import random

    from guards import rng_state, set_rng_state
    state = rng_state('cpu')
    draws = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(state)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(draws[0], again[0]) and np.array_equal(draws[1], again[1]) and draws[2] == again[2]


def test_checksum_and_fallback(run, logs, capsys):
    out = run('--max_iters=40', '--eval_interval=10', '--keep_last_n=2')
    assert sorted(f for f in os.listdir(out) if f.endswith('.pt')) == [
        'best.pt', 'ckpt-0000030.pt', 'ckpt-0000040.pt', 'ckpt.pt']
    # flip one byte in the middle of ckpt.pt, in place: the file still loads, but its checksum fails,
    # and so does ckpt-0000040.pt, the same file under another name
    data = bytearray((out / 'ckpt.pt').read_bytes())
    data[len(data) // 2] ^= 0xFF
    (out / 'ckpt.pt').write_bytes(data)
    assert torch.load(out / 'ckpt.pt', weights_only=True)['iter_num'] == 40
    with pytest.raises(checkpoint.CheckpointError, match='fails its checksum'):
        checkpoint.load(out / 'ckpt-0000040.pt')
    capsys.readouterr()
    run('--max_iters=50', '--eval_interval=10', '--init_from=resume')
    printed = capsys.readouterr().out
    assert printed.count('fails its checksum') == 2
    assert 'resuming from' in printed and 'ckpt-0000030.pt (iteration 30)' in printed
    assert [i for i, _ in logs.evals(out)][-2:] == [40, 50]


def test_no_usable_checkpoint(tmp_path):
    (tmp_path / 'ckpt.pt').write_bytes(b'not a checkpoint')
    with pytest.raises(checkpoint.CheckpointError, match='no usable checkpoint'):
        checkpoint.load_latest(str(tmp_path))


def poison(monkeypatch, param_name, bad_steps):
    """Make the gradient of one parameter NaN on the given optimizer steps (counted from 0)."""
    calls = {'n': -1}

    class Poisoned(model_module.GPT):
        def forward(self, idx, targets=None):
            if self.training:
                calls['n'] += 1
            return super().forward(idx, targets)

        def __init__(self, config):
            super().__init__(config)
            p = dict(self.named_parameters())[param_name]
            p.register_hook(lambda g: g * float('nan') if calls['n'] in bad_steps else g)
    monkeypatch.setattr(tasks, 'GPT', Poisoned)
    monkeypatch.setattr(train.Run, 'estimate', lambda self, argv: None)  # its timing passes would count here


def test_nan_stop_reports_iteration_and_parameter(run, tmp_path, monkeypatch):
    poison(monkeypatch, 'blocks.1.mlp.c_fc.weight', {7})
    with pytest.raises(SystemExit) as e:
        run('--max_iters=40', '--eval_interval=20')
    msg = str(e.value)
    assert 'at iteration 7' in msg and 'blocks.1.mlp.c_fc.weight' in msg and "nan_policy='stop'" in msg
    saved = checkpoint.load(tmp_path / 'out' / 'ckpt.pt')
    assert saved['iter_num'] == 10  # stopped at the first log interval after the bad step
    assert all(torch.isfinite(t).all() for t in saved['model'].values())


def test_nan_skip_continues_and_stops_after_a_streak(run, logs, tmp_path, monkeypatch):
    poison(monkeypatch, 'blocks.0.attn.c_proj.weight', {3, 4})
    run('--max_iters=30', '--eval_interval=30', '--nan_policy=skip')
    out = tmp_path / 'out'
    events = [r for r in logs.records(out) if r.get('event') == 'nonfinite']
    assert events == [{'iter': 5, 'event': 'nonfinite', 'first': 3, 'count': 2,
                       'params': ['blocks.0.attn.c_proj.weight']}]
    assert logs.evals(out)[-1][1] < logs.evals(out)[0][1]
    assert all(torch.isfinite(t).all() for t in checkpoint.load(out / 'ckpt.pt')['model'].values())

    poison(monkeypatch, 'wte.weight', set(range(8, 100)))
    with pytest.raises(SystemExit, match=r'consecutive steps skipped \(nan_max_skips=4\)'):
        run('--max_iters=30', '--nan_policy=skip', '--nan_max_skips=4', out='streak')


def test_switch_residual_rule_on_resume(run, logs, tmp_path):
    run('--max_iters=20', '--eval_interval=10')
    run('--max_iters=30', '--eval_interval=10', '--init_from=resume', '--residual=orthogonal')
    out = tmp_path / 'out'
    saved = checkpoint.load(out / 'ckpt.pt')
    assert saved['config']['residual'] == 'orthogonal'
    assert saved['history'] == [{'iter': 20, 'changes': {'max_iters': [20, 30], 'residual': ['additive', 'orthogonal']},
                                 'reset_optimizer': False}]
    assert any(r.get('event') == 'resume' for r in logs.records(out))
    # back to additive with a fresh optimizer: the schedule warms up again from iteration 30
    run('--max_iters=60', '--eval_interval=10', '--init_from=resume', '--residual=additive',
        '--reset_optimizer=True')
    saved = checkpoint.load(out / 'ckpt.pt')
    assert saved['history'][-1]['reset_optimizer'] and saved['schedule_start'] == 30
    lr_35 = [r['lr'] for r in logs.records(out) if r.get('iter') == 35 and 'lr' in r][0]
    assert lr_35 == pytest.approx(1e-2 * 5 / 6)  # warmup_iters=5: (34 - 30 + 1) / 6 of learning_rate


@pytest.mark.parametrize('args,expected', [
    (['--residual=rotation'], "residual 'additive' -> 'rotation': the two rules build different parameters"),
    (['--qkv=cayley'], r"qkv='dense' \(saved\) vs 'cayley' \(now\)"),
    (['--block_size=64'], "position table has 32 positions; resume with --block_size=32"),
])
def test_impossible_resumes_are_explained(run, args, expected):
    run('--max_iters=5', '--eval_interval=5')
    with pytest.raises(SystemExit, match=expected):
        run('--max_iters=10', '--init_from=resume', *args)


def test_resume_on_a_different_vocabulary(run, char_data):
    run('--max_iters=5', '--eval_interval=5')
    (char_data / 'input.txt').write_text('a completely different text, with new symbols: #@!' * 300)
    for f in ('train.bin', 'val.bin', 'meta.json'):
        (char_data / f).unlink()
    with pytest.raises(SystemExit, match='trained on a vocabulary of 39 tokens, the dataset now has'):
        run('--max_iters=10', '--init_from=resume')


@pytest.mark.parametrize('damage,expected', [
    (lambda b: b[:-3], 'odd number of bytes'),
    (lambda b: b[:-200], 'meta.json records'),
    (lambda b: b[:-2] + np.array([60000], dtype=np.uint16).tobytes(), 'token id 60000 but the vocabulary has'),
])
def test_damaged_token_files_are_refused(run, char_data, damage, expected):
    run('--max_iters=1', '--eval_interval=1')
    path = char_data / 'train.bin'
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(SystemExit, match=expected):
        run('--max_iters=1', out='again')


def test_out_of_memory_on_the_first_step(run, monkeypatch):
    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')
    monkeypatch.setattr(train, 'train_step', oom)
    with pytest.raises(SystemExit, match=r'out of memory in the first training step .* '
                                         r'--batch_size=4 --gradient_accumulation_steps=2'):
        run('--max_iters=5')


def test_sample_refuses_a_checkpoint_without_its_vocabulary(run):
    out = run('--max_iters=5', '--eval_interval=5')
    ckpt = torch.load(out / 'best.pt', weights_only=True)
    del ckpt['checksum']
    ckpt['meta'] = None
    checkpoint.save(ckpt, out / 'best.pt')
    with pytest.raises(SystemExit, match="vocabulary of 39 tokens is not GPT-2's"):
        sample.main([f'--out_dir={out}', '--max_new_tokens=5'])
    assert json.loads(torch.load(out / 'ckpt.pt', weights_only=True)['meta'])['vocab_size'] == 39


def test_torchrun_processes_agree_on_an_interruption(root, tiny, tmp_path, char_data, torchrun):
    """Ctrl-C in a terminal signals torchrun and every worker; the two processes stop at the same
    iteration, rank 0 saves both processes' data streams, and torchrun can resume the run."""
    out = tmp_path / 'ddp'
    args = ['config/shakespeare_add.py', *tiny, f'--data_dir={char_data}', f'--out_dir={out}', '--eval_interval=1000',
            '--gradient_accumulation_steps=2', '--dropout=0.1']
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py', *args]
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    proc = subprocess.Popen(cmd + ['--max_iters=5000'], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith('iter 20:'):
            os.killpg(proc.pid, signal.SIGINT)
            break
    lines += proc.stdout.readlines()
    proc.wait(timeout=120)
    stopped = [line for line in lines if line.startswith('stopped by SIGINT at iteration')]
    assert len(stopped) == 1, ''.join(lines)
    k = int(stopped[0].split('iteration ')[1].split(';')[0])
    saved = checkpoint.load(out / 'ckpt.pt')
    assert saved['iter_num'] == k and k % 5 == 0  # the processes agree at a log interval
    a, b = saved['streams']
    assert torch.equal(a['weights'], b['weights']), "the replicas hold the same weights"
    assert not set(a['batch_starts']) & set(b['batch_starts']), "each process trains on its own windows"
    done = torchrun(2, *args, f'--max_iters={k + 10}', '--init_from=resume', env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f'done: {k + 10} iterations' in done.stdout
