"""Stopping and resuming safely: exact resume after a real signal, checkpoint verification and
fallback, non-finite steps, switching the residual rule, and bad input. Where a test needs a model
that fails on cue, it registers a residual rule of its own, as a user would."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

import sample
from model import AdditiveUpdate
from orthogpt import checkpoint
from orthogpt.errors import UserError

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
    with pytest.raises(UserError, match='fails its checksum'):
        checkpoint.load(out / 'ckpt-0000040.pt')
    capsys.readouterr()
    run('--max_iters=50', '--eval_interval=10', '--init_from=resume')
    printed = capsys.readouterr().out
    assert printed.count('fails its checksum') == 2
    assert 'resuming from' in printed and 'ckpt-0000030.pt (iteration 30)' in printed
    assert [i for i, _ in logs.evals(out)][-2:] == [40, 50]


class Failing(AdditiveUpdate):
    """x + u, with a zero parameter that adds nothing; after_step counts steps (once at init, then
    after every optimizer step). In the residual layers `layers` (2i: block i's attention update,
    2i + 1: its MLP's), the parameter's gradient is NaN on the
    optimizer steps (counted from 0) in `nan_at`; from step `oom_from` on a training forward
    raises the allocator's out-of-memory error."""
    layers, nan_at, oom_from, steps = (), set(), None, 0

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))
        self.weight.register_hook(lambda g: g * float('nan') if self.steps - 1 in self.nan_at else g)

    @classmethod
    def from_config(cls, cfg, layer, causal):
        return cls() if layer in cls.layers else AdditiveUpdate()

    @classmethod
    def after_step(cls, model):
        cls.steps += 1

    def forward(self, x, u, cache=None):
        if self.training and torch.is_grad_enabled() and self.oom_from is not None and self.steps - 1 >= self.oom_from:
            raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')
        return x + u + self.weight


@pytest.fixture
def failing(registered):
    """failing(layers=(), nan_at=(), oom_from=None): '--residual=failing', configured so."""
    registered('failing', Failing)

    def configure(layers=(), nan_at=(), oom_from=None):
        Failing.layers, Failing.nan_at, Failing.oom_from, Failing.steps = tuple(layers), set(nan_at), oom_from, 0
        return '--residual=failing'
    return configure


def test_nan_stop_reports_iteration_and_parameter(run, tmp_path, failing):
    with pytest.raises(SystemExit) as e:
        run('--max_iters=40', '--eval_interval=20', failing(layers=[2], nan_at={7}))
    msg = str(e.value)
    assert 'at iteration 7' in msg and 'blocks.1.update_attn.weight' in msg and "nan_policy='stop'" in msg
    saved = checkpoint.load(tmp_path / 'out' / 'ckpt.pt')
    assert saved['iter_num'] == 10  # stopped at the first log interval after the bad step
    assert all(torch.isfinite(t).all() for t in saved['model'].values())


def test_nan_skip_continues_and_stops_after_a_streak(run, logs, tmp_path, failing):
    run('--max_iters=30', '--eval_interval=30', '--nan_policy=skip', failing(layers=[0, 1], nan_at={3, 4}))
    out = tmp_path / 'out'
    events = [r for r in logs.records(out) if r.get('event') == 'nonfinite']
    assert events == [{'iter': 5, 'event': 'nonfinite', 'first': 3, 'count': 2,
                       'params': ['blocks.0.update_attn.weight', 'blocks.0.update_mlp.weight']}]
    assert logs.evals(out)[-1][1] < logs.evals(out)[0][1]
    assert all(torch.isfinite(t).all() for t in checkpoint.load(out / 'ckpt.pt')['model'].values())
    with pytest.raises(SystemExit, match=r'consecutive steps skipped \(nan_max_skips=4\)'):
        run('--max_iters=30', '--nan_policy=skip', '--nan_max_skips=4', failing(layers=[0], nan_at=range(8, 100)),
            out='streak')


def test_switch_residual_rule_on_resume(run, logs, tmp_path):
    run('--max_iters=20', '--eval_interval=10')
    run('--max_iters=30', '--eval_interval=10', '--init_from=resume', '--residual=orthogonal')
    out = tmp_path / 'out'
    saved = checkpoint.load(out / 'ckpt.pt')
    assert saved['config']['residual'] == 'orthogonal'
    options = {'ortho_mode': 'feature', 'ortho_eps': 1e-6, 'ortho_prob': 1.0, 'ortho_layers': None}
    assert saved['history'] == [{'iter': 20, 'reset_optimizer': False, 'changes': {
        'max_iters': [20, 30], 'residual': ['additive', 'orthogonal'], 'options': [{}, options]}}]
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


@pytest.mark.parametrize('oom_from,when', [(0, 'the first training step'), (3, 'a training step')])
def test_out_of_memory_says_what_to_lower(run, failing, oom_from, when):
    """In the CPU estimate's timing pass (the first step) or in the loop (a later one)."""
    with pytest.raises(SystemExit, match=f'out of memory in {when} .* --batch_size=4 --gradient_accumulation_steps=2'):
        run('--max_iters=5', failing(layers=[0], oom_from=oom_from))


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
    """Ctrl-C in a terminal signals torchrun (its workers run in sessions of their own), which passes
    SIGINT to every worker: the two processes stop at the same iteration, rank 0 saves both
    processes' data streams, and the run resumes. torchrun itself then reports the signal it got,
    with a SignalException and exit status 1, as the README says: after the save, which it waited for."""
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
    assert proc.wait(timeout=120) == 1
    stopped = [i for i, line in enumerate(lines) if line.startswith('stopped by SIGINT at iteration')]
    assert len(stopped) == 1, ''.join(lines)
    assert 'SignalException: Process' in lines[-1] and 'got signal: 2' in lines[-1], ''.join(lines[-5:])
    stopped = [lines[stopped[0]]]
    k = int(stopped[0].split('iteration ')[1].split(';')[0])
    saved = checkpoint.load(out / 'ckpt.pt')
    assert saved['iter_num'] == k and k % 5 == 0  # the processes agree at a log interval
    a, b = saved['streams']
    assert torch.equal(a['weights'], b['weights']), "the replicas hold the same weights"
    done = torchrun(2, *args, f'--max_iters={k + 10}', '--init_from=resume', env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f'done: {k + 10} iterations' in done.stdout
