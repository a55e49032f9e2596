"""Runs that outgrow one machine, on one: torchrun's elastic restart after a worker is SIGKILLed, two
launchers that rendezvous on 127.0.0.1 as two machines would (under DDP and FSDP), and the loss of
one of them, SIGKILLed with its workers as a machine that fails takes its processes with it: with a
fixed number of machines the survivors end in one line, their checkpoints intact; with an elastic
one (--nnodes=1:2) the survivor continues from the newest checkpoint on its own. docs/cluster.md."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from orthogpt import checkpoint

pytestmark = pytest.mark.slow

STEPS = ['--max_iters=60', '--eval_interval=20', '--gradient_accumulation_steps=2', '--init_from=auto']
RESTARTABLE = {'TORCH_DISABLE_SHARE_RDZV_TCP_STORE': '1', 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
# an elastic launcher that has lost a machine forms a group of the rest once the lost one's heartbeats have
# stopped for 3 s and no other machine has come for 2 s (torchrun's defaults: 15 s and 30 s)
QUICK_RENDEZVOUS = '--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=2'
SURVIVOR_BOUND = 60  # seconds for the survivors of a lost machine to end; 2 to 4 on the 2-core VM


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def train_args(tiny, data, out, *extra):
    return ['train.py', 'config/shakespeare_add.py', *tiny, f'--data_dir={data}', f'--out_dir={out}', *STEPS, *extra]


# session scope: xdist's worksteal may leave a module and come back to it, which builds a module's fixture anew
@pytest.fixture(scope='session')
def data(tmp_path_factory, tiny_text):
    folder = tmp_path_factory.mktemp('data')
    (folder / 'input.txt').write_text(tiny_text, encoding='utf-8')
    return folder


@pytest.fixture(scope='session')
def uninterrupted(built_once, torchrun, tiny, data):
    """The log of an uninterrupted DDP run of two processes, --standalone."""
    def build(folder):
        done = torchrun(2, *train_args(tiny, data, folder / 'out')[1:], env=dict(os.environ, **RESTARTABLE))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return built_once('uninterrupted', build) / 'out'


class Launcher:
    """A torchrun launcher in a session of its own, as on a machine of its own, its output in a file."""

    def __init__(self, root, log, launch_args, args, env):
        self.log = log
        cmd = [sys.executable, '-m', 'torch.distributed.run', *launch_args, *map(str, args)]
        with open(log, 'w') as f:
            self.proc = subprocess.Popen(cmd, cwd=root, stdout=f, stderr=subprocess.STDOUT,
                                         env=dict(os.environ, **env), start_new_session=True)

    def output(self):
        return self.log.read_text()

    def finish(self, timeout=240):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"torchrun ran past {timeout} s:\n{self.output()[-4000:]}")


def machines(root, tmp_path, nnodes, args, max_restarts=0, extra=()):
    """Two launchers that rendezvous on 127.0.0.1: A first, so that it holds the rendezvous store (torchrun's
    c10d backend keeps it in the launcher of the endpoint's machine), then B."""
    port = free_port()
    common = [f'--nnodes={nnodes}', '--nproc_per_node=1', '--rdzv-backend=c10d', f'--rdzv-endpoint=127.0.0.1:{port}',
              f'--rdzv-id=test{port}', f'--max-restarts={max_restarts}', *extra]
    a = Launcher(root, tmp_path / 'A.log', common, args, RESTARTABLE)
    time.sleep(1)
    return a, Launcher(root, tmp_path / 'B.log', common, args, RESTARTABLE)


def wait_for(path, launchers, timeout=120):
    start = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - start > timeout or any(l.proc.poll() is not None for l in launchers):
            pytest.fail(f"no {path} after {time.monotonic() - start:.0f} s:\n"
                        + '\n'.join(l.output()[-3000:] for l in launchers))
        time.sleep(0.1)


def lose(launcher, processes):
    """The launcher's machine lost: the launcher and its workers SIGKILLed together."""
    doomed = [launcher.proc.pid, *processes.descendants(launcher.proc.pid)]
    processes.kill_all(doomed)
    launcher.proc.wait()
    return doomed


def test_an_elastic_restart_after_a_killed_worker_ends_as_the_uninterrupted_run(root, tiny, data, tmp_path,
                                                                                 uninterrupted, logs, processes):
    """torchrun --max-restarts=3 with a store per restart: a worker SIGKILLed at iteration 45 fails the group,
    torchrun restarts both workers, --init_from=auto continues from the checkpoint at 40, and the run ends
    with the log of one never interrupted."""
    out = tmp_path / 'out'
    launcher = Launcher(root, tmp_path / 'run.log', ['--standalone', '--nproc_per_node=2', '--max-restarts=3'],
                        train_args(tiny, data, out), RESTARTABLE)
    wait_for(out / 'ckpt-0000040.pt', [launcher])
    workers = processes.descendants(launcher.proc.pid)
    assert len(workers) == 2, workers
    os.kill(workers[-1], signal.SIGKILL)
    assert launcher.finish() == 0, launcher.output()[-4000:]
    printed = launcher.output()
    assert f'resuming from {out}/ckpt.pt (iteration 40)' in printed, printed[-3000:]
    assert logs.losses(out) == logs.losses(uninterrupted)


def test_restarts_into_the_shared_rendezvous_store_are_refused_in_one_line(torchrun, root, tiny, data, tmp_path):
    """Without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 a restarted group can read the dead one's addresses
    (pytorch/pytorch#135712): --max-restarts is refused at the start, before anything is written."""
    env = {k: v for k, v in os.environ.items() if k != 'TORCH_DISABLE_SHARE_RDZV_TCP_STORE'}
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=1', '--max-restarts=1',
           *train_args(tiny, data, tmp_path / 'out')]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode != 0
    refusals = [line for line in done.stderr.splitlines() if line.startswith('error: ')]
    assert refusals and all('TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1' in line for line in refusals), done.stderr[-3000:]
    assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('parallel', ['ddp', 'fsdp'])
def test_two_launchers_train_as_one_standalone_group(parallel, root, tiny, data, tmp_path, torchrun, uninterrupted,
                                                     logs):
    """Two machines (a launcher and one worker each, --nnodes=2, c10d rendezvous) train to the log of
    --standalone --nproc_per_node=2, whichever of them rendezvous makes rank 0."""
    reference = uninterrupted
    if parallel == 'fsdp':
        reference = tmp_path / 'standalone'
        done = torchrun(2, *train_args(tiny, data, reference, '--parallel=fsdp')[1:], env=dict(os.environ, **RESTARTABLE))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = tmp_path / 'two'
    a, b = machines(root, tmp_path, 2, train_args(tiny, data, out, f'--parallel={parallel}'))
    assert (a.finish(), b.finish()) == (0, 0), a.output()[-3000:] + b.output()[-3000:]
    assert logs.losses(out) == logs.losses(reference)


def test_losing_a_machine_ends_the_survivors_in_one_line_and_keeps_the_checkpoints(root, tiny, data, tmp_path,
                                                                                   processes):
    """--nnodes=2: machine B is lost after the checkpoint at 40. The worker on A ends in one line at its next
    collective, and its launcher after it, within SURVIVOR_BOUND; every checkpoint verifies."""
    out = tmp_path / 'out'
    a, b = machines(root, tmp_path, 2, train_args(tiny, data, out, '--max_iters=100000'))
    survivors = []
    try:
        wait_for(out / 'ckpt-0000040.pt', [a, b])
        survivors = [a.proc.pid, *processes.descendants(a.proc.pid)]
        lose(b, processes)
        start = time.monotonic()
        a.finish(timeout=SURVIVOR_BOUND)
        took = time.monotonic() - start
        processes.wait_gone(survivors, 10)
    finally:
        processes.kill_all(survivors)
    errors = [line for line in a.output().splitlines() if line.startswith('error: ')]
    assert len(errors) == 1 and "this process lost the run's other processes" in errors[0], a.output()[-3000:]
    assert f'The checkpoints in {out} are kept as they were' in errors[0]
    paths = checkpoint.candidates(out)
    assert paths and all(checkpoint.look(p).why is None for p in paths), [checkpoint.look(p) for p in paths]
    print(f"survivors gone {took:.1f} s after the loss of machine B")


def test_an_elastic_run_that_loses_a_machine_continues_on_the_survivor(root, tiny, data, tmp_path, processes,
                                                                      uninterrupted, logs):
    """--nnodes=1:2 --max-restarts=1: after machine B is lost, A's worker fails, its launcher forms a group of
    one and --init_from=auto resumes the newest checkpoint at world size 1 (the data streams re-seeded), on to
    max_iters."""
    out = tmp_path / 'out'
    a, b = machines(root, tmp_path, '1:2', train_args(tiny, data, out), max_restarts=1, extra=[QUICK_RENDEZVOUS])
    try:
        wait_for(out / 'ckpt-0000040.pt', [a, b])
        lose(b, processes)
        assert a.finish() == 0, a.output()[-4000:]
    finally:
        if a.proc.poll() is None:
            processes.kill_all([a.proc.pid, *processes.descendants(a.proc.pid)])
    printed = a.output()
    resumed = [line for line in printed.splitlines() if line.startswith('resuming from')]
    assert resumed and 'note: checkpoint written by 2 processes, resuming on 1' in printed, printed[-4000:]
    k = int(resumed[-1].split('(iteration ')[1].rstrip(')'))
    assert k >= 40 and [r for r in logs.losses(out) if r[0] <= k] == [r for r in logs.losses(uninterrupted) if r[0] <= k]
    final, reference = logs.evals(out)[-1], logs.evals(uninterrupted)[-1]
    assert final[0] == reference[0] == 60
    print(f"final val loss {final[1]:.4f} against the uninterrupted run's {reference[1]:.4f}, resumed at {k}")


def mount_namespaces():
    """Whether this process may make a mount namespace of its own (unshare, as root, where the sandbox allows it)."""
    return (os.geteuid() == 0 and shutil.which('unshare') is not None
            and subprocess.run(['unshare', '--mount', 'true'], capture_output=True).returncode == 0)


@pytest.mark.skipif(not mount_namespaces(), reason="a machine with a folder of its own is a mount namespace "
                                                   "(unshare --mount), which needs root and a sandbox that allows it")
@pytest.mark.parametrize('private', ['out_dir', 'data'])
def test_a_machine_without_the_shared_folder_stops_every_process_in_one_line(private, root, tiny, data, tmp_path):
    """Machine B runs in a mount namespace of its own (unshare), where an empty file system covers the run's
    folder or its data: what B sees where the folder lies on a disk of A's alone. Every process of both machines
    stops in one line that names the folder, none waiting in a collective."""
    from orthogpt import chars
    chars.ready(str(data))  # prepared where A sees it
    runs = tmp_path / 'runs'
    runs.mkdir()
    covered = runs if private == 'out_dir' else data
    port = free_port()
    launch = [sys.executable, '-m', 'torch.distributed.run', '--nnodes=2', '--nproc_per_node=1', '--rdzv-backend=c10d',
              f'--rdzv-endpoint=127.0.0.1:{port}', f'--rdzv-id=test{port}',
              *train_args(tiny, data, runs / 'out')]
    env = dict(os.environ, **RESTARTABLE)
    a = subprocess.Popen(launch, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    b = subprocess.Popen(['unshare', '--mount', 'sh', '-c', f'mount -t tmpfs none {covered} && exec "$@"', 'sh',
                          *launch], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    outputs = [p.communicate(timeout=SURVIVOR_BOUND + 60)[0] for p in (a, b)]
    assert a.returncode and b.returncode
    for printed in outputs:
        errors = [line for line in printed.splitlines() if line.startswith('error: ')]
        assert len(errors) == 1 and str(covered) in errors[0], printed[-3000:]
        print(errors[0])
    if private == 'out_dir':
        assert "out_dir must lie on a file system that every machine of the run shares" in outputs[0]
