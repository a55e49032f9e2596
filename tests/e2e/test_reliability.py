"""Stopping and resuming safely: exact resume after a real signal, checkpoint verification and
fallback, non-finite steps, switching the residual rule, and bad input; and the faults of
docs/reliability.md injected into whole runs: a second writer, a killed torchrun launcher, a
full disk, a damaged log. Where a test needs a model that fails on cue, it registers a residual
rule of its own, as a user would."""

import errno
import json
import os
import signal
import socket
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
    assert f"warning: {out / 'ckpt.pt'} fails its checksum: its contents changed after it was written (the same file " \
           f"as ckpt-0000040.pt" in printed
    assert f'resuming from {out}/ckpt-0000030.pt (iteration 30), the newest checkpoint that verifies' in printed
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

    def forward(self, x, u, sub=None):
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


def test_a_resume_refuses_a_max_iters_the_checkpoint_has_passed(run, tmp_path):
    run('--max_iters=20', '--eval_interval=10')
    with pytest.raises(SystemExit, match=r"max_iters=10 lies before the checkpoint's iteration 20; resume with "
                                         r"--max_iters=20 or more"):
        run('--max_iters=10', '--init_from=resume')
    assert checkpoint.load(tmp_path / 'out' / 'ckpt.pt')['iter_num'] == 20


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


def started(cmd, root, until):
    """cmd in a process (and session) of its own, printing unbuffered, once it has printed a line
    that starts with `until`; (the process, the lines it printed)."""
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1'),  # as torchrun's workers
                            start_new_session=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(until):
            return proc, lines
    pytest.fail(f"{cmd} ended before printing {until!r}:\n{''.join(lines[-30:])}")


def test_a_second_writer_is_refused_and_starts_at_once_after_the_first_is_killed(run, root, tiny, char_data, tmp_path,
                                                                                capsys):
    """A run holds its out_dir: a second train.py on it (a resume, as a user who forgot the first
    would type) is refused at once, naming the first; after a SIGKILL of the first, which leaves
    no stale lock, the same command resumes from the first one's checkpoint."""
    out = tmp_path / 'out'
    first, _ = started([sys.executable, 'train.py', 'config/shakespeare_add.py', *tiny, f'--data_dir={char_data}',
                        f'--out_dir={out}', '--max_iters=100000', '--eval_interval=10'], root, 'iter 15:')
    try:
        with pytest.raises(SystemExit) as refused:
            run('--max_iters=30', '--eval_interval=10', '--init_from=resume')
        assert str(refused.value).startswith(f"error: {out} is in use by another run: pid {first.pid} on "
                                             f"{socket.gethostname()}, started 2")
        assert 'train.py config/shakespeare_add.py' in str(refused.value) and f'kill {first.pid}' in str(refused.value)
        sample.main([f'--out_dir={out}', '--num_samples=1', '--max_new_tokens=5'])  # a reader takes no lock
    finally:
        first.kill()
        first.wait()
    k = checkpoint.load(out / 'ckpt.pt')['iter_num']
    capsys.readouterr()
    run(f'--max_iters={k + 10}', '--eval_interval=10', '--init_from=resume')
    printed = capsys.readouterr().out
    assert f'(iteration {k})' in printed and f'done: {k + 10} iterations' in printed


def test_a_truncated_newest_checkpoint_then_resume_then_sigterm_keeps_what_verifies(run, logs, root, tiny, char_data,
                                                                                   tmp_path, capsys):
    """The sequence a user met: ckpt.pt, best.pt and ckpt-0000040.pt are one file (hard links), which a full disk or
    a copy cut short truncates; the resumed run falls back to ckpt-0000030.pt and is stopped by SIGTERM before its
    next evaluation. Its save keeps ckpt-0000030.pt (the newest older checkpoint that verifies), moves the damaged
    names into damaged/ and points best.pt at a checkpoint that verifies; sample.py then samples with no warning."""
    out = run('--max_iters=40', '--eval_interval=10', '--keep_last_n=2')
    evals = dict(logs.evals(out))
    assert min(evals, key=evals.get) == 40, evals  # so best.pt is ckpt.pt too
    assert os.path.samefile(out / 'best.pt', out / 'ckpt.pt') and os.path.samefile(out / 'ckpt.pt', out / 'ckpt-0000040.pt')
    with open(out / 'ckpt.pt', 'r+b') as f:
        f.truncate(os.path.getsize(out / 'ckpt.pt') // 2)
    proc, lines = started([sys.executable, 'train.py', 'config/shakespeare_add.py', *tiny, f'--data_dir={char_data}',
                           f'--out_dir={out}', '--max_iters=100000', '--eval_interval=100000', '--init_from=resume'],
                          root, 'iter 35:')
    proc.send_signal(signal.SIGTERM)
    lines += proc.stdout.readlines()
    assert proc.wait(timeout=120) == 0, ''.join(lines)
    printed = ''.join(lines)
    assert f"warning: {out / 'ckpt.pt'} is not a readable checkpoint (truncated, corrupt or not ours: " in printed
    assert f"resuming from {out / 'ckpt-0000030.pt'} (iteration 30), the newest checkpoint that verifies" in printed
    k = int(printed.split('stopped by SIGTERM at iteration ')[1].split(';')[0])
    assert f"warning: {out / 'ckpt-0000040.pt'} is not a readable checkpoint (" in printed
    assert f"(the same file as best.pt); moved into {out / 'damaged'}/, where nothing reads it" in printed, printed
    best_at_30 = evals[30] < min(evals[10], evals[20])  # the checkpoint at 30 was saved as the best
    assert sorted(os.listdir(out)) == ['best.pt'] * best_at_30 + [
        'ckpt-0000030.pt', f'ckpt-{k:07d}.pt', 'ckpt.pt', 'config.json', 'damaged', 'log.jsonl']
    assert sorted(os.listdir(out / 'damaged')) == ['best.pt', 'ckpt-0000040.pt']
    assert checkpoint.load(out / 'ckpt.pt')['iter_num'] == k >= 35 and checkpoint.load(out / 'ckpt-0000030.pt')['iter_num'] == 30
    if best_at_30:
        assert os.path.samefile(out / 'best.pt', out / 'ckpt-0000030.pt')
    capsys.readouterr()
    sample.main([f'--out_dir={out}', '--num_samples=1', '--max_new_tokens=20', '--start=ROMEO:'])
    text = capsys.readouterr().out
    assert text.startswith('ROMEO:') and 'warning' not in text


LAUNCHER_BOUND = 30  # seconds for a killed launcher's workers to save and leave; a few on an idle machine


@pytest.mark.slow
def test_workers_leave_with_their_killed_launcher_and_the_run_resumes(run, root, tiny, char_data, tmp_path, capsys,
                                                                      processes, torchrun):
    """torchrun's 2 workers run in sessions of their own. While they train, a second torchrun on
    their out_dir is refused (by its rank 0, all its processes stopping together). Then the launcher
    is SIGKILLed: its workers get SIGTERM (prctl's parent-death signal), stop at the next log line
    with a checkpoint, and are gone within LAUNCHER_BOUND seconds; the run resumes at once."""
    out = tmp_path / 'ddp'
    args = ['config/shakespeare_add.py', *tiny, f'--data_dir={char_data}', f'--out_dir={out}',
            '--gradient_accumulation_steps=2', '--eval_interval=100000']
    launcher, lines = started([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                               'train.py', *args, '--max_iters=100000'], root, 'iter 20:')
    workers = processes.descendants(launcher.pid)
    try:
        assert len(workers) == 2, workers
        second = torchrun(2, *args, '--max_iters=100000', '--init_from=resume', timeout=120)
        refusal = f'{out} is in use by another run: pid '
        assert second.returncode != 0 and refusal in second.stderr, second.stdout[-2000:] + second.stderr[-4000:]
        assert int(second.stderr.split(refusal)[1].split()[0]) in workers  # rank 0 holds it
        launcher.kill()
        took = processes.wait_gone(workers, LAUNCHER_BOUND)
    except BaseException:  # what is left of the first run, if the test failed
        processes.kill_all([launcher.pid, *workers])
        raise
    finally:
        launcher.wait()
    lines += launcher.stdout.readlines()  # the workers, gone, have closed it
    stopped = [line for line in lines if line.startswith('stopped by SIGTERM at iteration')]
    assert len(stopped) == 1, ''.join(lines[-20:])
    k = int(stopped[0].split('iteration ')[1].split(';')[0])
    assert checkpoint.load(out / 'ckpt.pt')['iter_num'] == k and k % 5 == 0, took
    capsys.readouterr()
    run(f'--max_iters={k + 10}', '--gradient_accumulation_steps=2', '--eval_interval=100000', '--init_from=resume',
        out='ddp')
    printed = capsys.readouterr().out
    assert f'(iteration {k})' in printed and f'done: {k + 10} iterations' in printed
    print(f"workers gone {took:.1f} s after the launcher's SIGKILL")


@pytest.mark.parametrize('error', [errno.ENOSPC, errno.EIO, errno.EROFS], ids=errno.errorcode.get)
def test_a_checkpoint_write_that_fails_stops_the_run_and_keeps_the_last_one(run, logs, broken_disk, monkeypatch,
                                                                           error):
    """The disk fills (or fails, or turns read-only) under the checkpoint at iteration 20: the run
    stops there with a message that says so, ckpt.pt still holds iteration 10 and loads, no partial
    file is left, and once the disk is mended the run resumes from 10."""
    out = run('--max_iters=10', '--eval_interval=10')
    broken_disk(error, 'ckpt.pt')
    with pytest.raises(SystemExit) as stop:
        run('--max_iters=30', '--eval_interval=10', '--init_from=resume')
    assert str(stop.value).startswith(f"error: could not write {out / 'ckpt.pt'}: {os.strerror(error)} "
                                      f"(errno {error}), ")
    assert 'free there; the previous ckpt.pt is kept as it was, the partial file removed' in str(stop.value)
    assert checkpoint.load(out / 'ckpt.pt')['iter_num'] == 10
    assert not [f for f in os.listdir(out) if '.tmp' in f] and not (out / 'ckpt-0000020.pt').exists()
    monkeypatch.undo()  # the disk mended
    run('--max_iters=30', '--eval_interval=10', '--init_from=resume')
    assert [i for i, _ in logs.evals(out)] == [0, 10, 20, 30]


def test_a_log_line_cut_in_half_does_not_stop_a_resume(run, logs, tmp_path, capsys):
    """Lines of log.jsonl and dynamics.jsonl cut in half: one glued to the next (a writer killed
    mid-line, then a second writer's line), and the last one (a run killed after its checkpoint).
    The resume drops them with a warning naming the file and the line, and goes on; so do the
    readers (tools/plot_curves.py)."""
    from tools import plot_curves
    args = ['--eval_interval=10', '--dynamics=True', '--dynamics_interval=5']
    out = run('--max_iters=20', *args)
    for name in ('log', 'dynamics'):
        lines = (out / f'{name}.jsonl').read_text().splitlines(keepends=True)
        assert 'val_loss' not in lines[2] + lines[3]
        lines[2:4] = [lines[2][:len(lines[2]) // 2] + lines[3]]
        lines.append('{"iter": 25, "loss": 2.')
        (out / f'{name}.jsonl').write_text(''.join(lines))
    capsys.readouterr()
    run('--max_iters=30', '--init_from=resume', *args)
    printed = capsys.readouterr().out
    for name, last in (('log', 8), ('dynamics', 4)):
        for line in (3, last):
            assert f"warning: {out / name}.jsonl line {line} is not a whole record, dropped" in printed, printed
    assert 'done: 30 iterations' in printed
    assert [i for i, _ in logs.evals(out)] == [0, 10, 20, 30]
    assert [r['iter'] for r in logs.records(out / 'dynamics.jsonl')] == [5, 10, 25, 30]
    plot_curves.main([str(out), f'--out={tmp_path / "curves.png"}'])
    assert (tmp_path / 'curves.png').stat().st_size > 0


def files_of(folder):
    """{name: (bytes, modification time)} of every file in folder: what a run that changes nothing leaves."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file()}


def test_auto_starts_fresh_continues_and_leaves_a_complete_run_as_it_is(run, logs, capsys):
    """--init_from=auto: a fresh run where out_dir holds no checkpoint; started again once complete, one
    line and exit 0 with nothing on disk changed; another config refused in one line; a larger max_iters
    continues exactly as one run would have gone."""
    args = ['--eval_interval=10', '--lr_decay_iters=30', '--init_from=auto']  # the 30-iteration run's schedule
    full = run('--max_iters=30', *args, out='full')
    out = run('--max_iters=20', *args)
    before = files_of(out)
    best = checkpoint.load(out / 'ckpt.pt')['best_val_loss']
    capsys.readouterr()
    run('--max_iters=20', *args)
    assert capsys.readouterr().out.splitlines() == [
        f"{out} holds a complete run: iteration 20 of max_iters=20, best val loss {best:.4f}; nothing to do (to train "
        f"on, raise --max_iters; for another run, give another --out_dir)"]
    assert files_of(out) == before
    with pytest.raises(SystemExit) as refused:
        run('--max_iters=20', *args, '--n_layer=3')
    assert str(refused.value) == f"error: cannot resume from {out} with this config: n_layer=2 (saved) vs 3 (now)"
    assert files_of(out) == before
    run('--max_iters=30', *args)
    assert logs.losses(out) == logs.losses(full)


@pytest.mark.parametrize('count', ['TORCHELASTIC_RESTART_COUNT', 'SLURM_RESTART_COUNT'])
def test_a_run_that_its_launcher_restarts_continues_its_checkpoint(run, logs, capsys, monkeypatch, count):
    """torchrun's restart of the same command, or Slurm's requeue, continues the run in out_dir whatever
    init_from says (torchtitan's rule); by hand the same command is refused, naming --init_from=auto."""
    out = run('--max_iters=10', '--eval_interval=10')
    with pytest.raises(SystemExit, match='would overwrite it; continue it with --init_from=auto'):
        run('--max_iters=20', '--eval_interval=10')
    monkeypatch.setenv(count, '1')
    capsys.readouterr()
    run('--max_iters=20', '--eval_interval=10')
    assert f"resuming from {out / 'ckpt.pt'} (iteration 10)" in capsys.readouterr().out
    assert [i for i, _ in logs.evals(out)] == [0, 10, 20]


def states(path):
    """The model's and the optimizer's tensors of a checkpoint file, flattened in order."""
    saved = checkpoint.load(path)
    return [t for t in torch.utils._pytree.tree_leaves([saved['model'], saved['optimizer']]) if torch.is_tensor(t)]


def test_an_async_save_writes_the_checkpoints_of_a_save_in_the_loop(run, logs):
    """--async_save=True: the checkpoints are written by a thread from a copy taken at the save, while training
    changes the originals; the log and every checkpoint are those of the run that writes in the loop."""
    sync = run('--max_iters=30', '--eval_interval=10', out='sync')
    out = run('--max_iters=30', '--eval_interval=10', '--async_save=True', out='async')
    assert logs.losses(out) == logs.losses(sync)
    for name in ('ckpt-0000020.pt', 'ckpt.pt'):
        a, b = states(out / name), states(sync / name)
        assert len(a) == len(b) > 0 and all(torch.equal(x, y) for x, y in zip(a, b)), name
    assert [r['iter'] for r in logs.records(out) if 'save_s' in r] == [10, 20, 30]


def test_an_async_save_that_fails_stops_the_run_at_the_next_save_and_keeps_the_last_one(run, logs, broken_disk):
    """The disk fills under the checkpoint that a thread writes at 20: training goes on, and the run stops where it
    next waits for that write, at the save at 30 (whose evaluation, logged once its save is done, is not), with the
    message of a failed save; ckpt.pt still holds 10."""
    out = run('--max_iters=10', '--eval_interval=10')
    broken_disk(errno.ENOSPC, 'ckpt.pt')
    with pytest.raises(SystemExit) as stop:
        run('--max_iters=50', '--eval_interval=10', '--init_from=resume', '--async_save=True')
    assert str(stop.value).startswith(f"error: could not write {out / 'ckpt.pt'}: No space left on device")
    assert 'the previous ckpt.pt is kept as it was, the partial file removed' in str(stop.value)
    assert checkpoint.load(out / 'ckpt.pt')['iter_num'] == 10 and not (out / 'ckpt-0000020.pt').exists()
    assert [i for i, _ in logs.evals(out)] == [0, 10, 20]
