"""Fixtures shared by the test modules (which never import each other). tests/unit holds the quick
tests of the mathematics and of single functions; tests/kernels the Triton kernels' under the
interpreter (slow on a CPU); tests/e2e the ones that run train.py, torchrun, the tools or a compiler."""

import errno
import fcntl
import gzip
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from types import SimpleNamespace

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)
# Triton's kernels (orthogpt/hc_kernels.py) run on CPU tensors under its interpreter, which decides when they are
# defined, as orthogpt is first imported: before any test module imports it
os.environ.setdefault('TRITON_INTERPRET', '1')
# pytest-xdist's workers (-n) share the cores as compare.py's runs do (docs/performance.md, "Advice for CPU users");
# the processes a test starts inherit the share
if int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', 1)) > 1:
    from orthogpt.estimate import thread_share
    os.environ['OMP_NUM_THREADS'] = str(thread_share(int(os.environ['PYTEST_XDIST_WORKER_COUNT'])))
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))

def pytest_configure(config):
    config.addinivalue_line('markers', "slow: a test of many processes or a long run; CI runs it, first (below)")


def pytest_collection_modifyitems(items):
    """The slow tests first in each pytest-xdist worker's share: --dist=worksteal hands the workers contiguous
    shares of the list, then moves the tail of the longest queue to an idle worker. With the slow tests dealt out
    to the heads of the shares, every worker starts on them and the quick ones fill the gaps, rather than one
    worker ending the suite alone on a long test."""
    n = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', 1))
    slow = [item for item in items if item.get_closest_marker('slow')]
    quick = [item for item in items if not item.get_closest_marker('slow')]
    shares, left = [], len(items)
    for i in range(n):  # the sizes worksteal gives: what is left over the workers still to serve
        shares.append(left // (n - i))
        left -= shares[-1]
    dealt = [slow[i::n] for i in range(n)]
    ordered = []
    for share, heads in zip(shares, dealt):
        take = max(0, share - len(heads))
        ordered += heads + quick[:take]
        quick = quick[take:]
    items[:] = ordered + quick


# a 2-layer model that trains in seconds on the CPU; tests add the keys they exercise
TINY = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=8', '--eval_iters=4',
        '--log_interval=5', '--warmup_iters=5', '--learning_rate=1e-2', '--device=cpu', '--compile=False']


def small_gpt_config(**keys):
    """A GPTConfig of 2 layers x 16 over 11 tokens and 16 positions, `keys` set over it; the keys
    that are not GPTConfig's are the rule's options (ortho_mode=..., say)."""
    from dataclasses import fields

    from model import GPTConfig
    keys = {'n_layer': 2, 'n_head': 2, 'n_embd': 16, 'block_size': 16, 'vocab_size': 11, **keys}
    names = {f.name for f in fields(GPTConfig)}
    return GPTConfig(**{k: v for k, v in keys.items() if k in names},
                     options={k: v for k, v in keys.items() if k not in names})


@pytest.fixture(scope='session')
def kernel_device():
    """Where the fused kernels' tests run them: on the CPU under Triton's interpreter (TRITON_INTERPRET=1, the
    default above), or, with TRITON_INTERPRET=0, compiled on the CUDA GPU (tools/suite.py's kernel_check stage)."""
    if os.environ['TRITON_INTERPRET'] == '1':
        return 'cpu'
    if not torch.cuda.is_available():
        pytest.skip("TRITON_INTERPRET=0 runs the kernels compiled on a CUDA GPU, and this machine has none")
    return 'cuda'


@pytest.fixture(scope='session')
def gpt_config():
    """gpt_config(**keys): small_gpt_config."""
    return small_gpt_config


def write_gpt2(folder, vocab_size=39, n_positions=32, seed=0):
    """A random GPT-2 of transformers (2 layers x 32) saved in the Hugging Face layout, every
    parameter (biases, LayerNorm gains) drawn; returns the transformers model."""
    import transformers
    torch.manual_seed(seed)
    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=vocab_size, n_positions=n_positions, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=0)).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ref.save_pretrained(folder)
    return ref


@pytest.fixture(scope='session')
def gpt2_folder():
    """gpt2_folder(folder, vocab_size=39, n_positions=32, seed=0): write_gpt2."""
    pytest.importorskip('transformers')
    return write_gpt2


def synthetic_images(n, size=28, seed=0):
    """Class c is a bright square at the c-th of ten places on a noisy background."""
    g = np.random.default_rng(seed)
    labels = g.integers(0, 10, n)
    x = g.integers(0, 60, (n, size, size)).astype(np.uint8)
    for i, c in enumerate(labels):
        r, q = divmod(int(c), 5)
        x[i, 4 + 12 * r:10 + 12 * r, 1 + 5 * q:6 + 5 * q] = 250
    return x, labels.astype(np.uint8)


def write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + b''.join(int(n).to_bytes(4, 'big') for n in array.shape)
    with gzip.open(path, 'wb') as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def idx_dir(tmp_path):
    """A Fashion-MNIST-shaped folder of IDX files (640 train, 200 test images) of `synthetic` classes."""
    folder = tmp_path / 'fmnist'
    folder.mkdir()
    for split, n, seed in (('train', 640, 0), ('t10k', 200, 1)):
        x, y = synthetic_images(n, seed=seed)
        write_idx(folder / f'{split}-images-idx3-ubyte.gz', x)
        write_idx(folder / f'{split}-labels-idx1-ubyte.gz', y)
    return folder


@pytest.fixture(scope='session')
def images_kit():
    """images_kit.synthetic(n, size=28, seed=0) -> (uint8 images, labels); images_kit.write_idx(path, array)."""
    return SimpleNamespace(synthetic=synthetic_images, write_idx=write_idx)


def decoding_in_pieces(net, idx, cuts=((0, 5), (5, 6), (6, 16))):
    """Feeds idx (B, T) through a DecodeState in pieces and checks the logits against one full
    forward's (the model in float64, eval mode); returns the full forward's logits."""
    from model import DecodeState
    full, _ = net(idx)
    state = DecodeState(net.config.block_size)
    pieces = [net(idx[:, a:b], cache=state)[0] for a, b in cuts]
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=0, atol=1e-10)
    return full


@pytest.fixture(scope='session')
def decodes_in_pieces():
    """decodes_in_pieces(net, idx): decoding_in_pieces."""
    return decoding_in_pieces


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


@pytest.fixture(scope='session')
def root():
    """The repository's folder."""
    return ROOT


@pytest.fixture(scope='session')
def built_once(tmp_path_factory):
    """built_once(name, build): a folder that build(folder) fills once in this test session. A session fixture is
    built by each pytest-xdist worker that needs it; through this, by the first, while the others wait on a lock,
    then read the same folder. For a folder the tests only read, or add to under names of their own."""
    def get(name, build):
        if 'PYTEST_XDIST_WORKER' not in os.environ:  # no workers
            folder = tmp_path_factory.mktemp(name)
            build(folder)
            return folder
        folder = tmp_path_factory.getbasetemp().parent / name  # the workers' common folder, this session's
        with open(f'{folder}.lock', 'w') as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # freed when its holder ends, whatever ends it
            if not (folder / '.built').exists():
                shutil.rmtree(folder, ignore_errors=True)  # a build that failed
                folder.mkdir()
                build(folder)
                (folder / '.built').touch()
        return folder
    return get


@pytest.fixture(scope='session')
def tiny():
    """--key=value arguments of a tiny CPU model for train.py."""
    return list(TINY)


@pytest.fixture(scope='session')
def tiny_text():
    """A small deterministic corpus with enough structure for a tiny model to learn."""
    words = ['to', 'be', 'or', 'not', 'the', 'king', 'queen', 'my', 'lord', 'shall', 'we', 'go', 'now']
    g = torch.Generator().manual_seed(1)
    lines = []
    for i in range(400):
        ids = torch.randint(len(words), (6,), generator=g).tolist()
        speaker = 'ROMEO' if i % 2 else 'JULIET'
        lines.append(f"{speaker}:\n{' '.join(words[j] for j in ids).capitalize()}.\n")
    return '\n'.join(lines)


@pytest.fixture
def char_data(tmp_path, tiny_text):
    """A data folder holding only input.txt: train.py prepares it on first use."""
    folder = tmp_path / 'data'
    folder.mkdir()
    (folder / 'input.txt').write_text(tiny_text, encoding='utf-8')
    return folder


@pytest.fixture
def registered():
    """registered(name, rule_class): a residual rule registered as a user would, for this test only."""
    from model import RESIDUALS, register
    names = []

    def add(name, cls):
        cls = register(name)(cls)
        names.append(name)
        return cls
    yield add
    for name in names:
        del RESIDUALS[name]


@pytest.fixture
def grad_norms(tmp_path, char_data):
    """grad_norms(*args, config='shakespeare_add.py'): tools/plot_grad_norms.py on a 2-layer x 16 model
    (one batch, one seed) with args; the rows of its CSV."""
    def measure(*args, config='shakespeare_add.py'):
        import csv

        from tools import plot_grad_norms
        out = tmp_path / 'grad-norms'
        plot_grad_norms.main([os.path.join(ROOT, 'config', config), '--n_layer=2', '--n_embd=16', '--n_head=2',
                              '--block_size=16', '--batch_size=2', '--batches=1', '--seeds=1', f'--data_dir={char_data}',
                              f'--out={out}', *args])
        with open(f'{out}.csv') as f:
            return list(csv.DictReader(f))
    return measure


@pytest.fixture
def run(tmp_path, char_data):
    """run(*args, config=..., out=...): train.main on the tiny model and char_data; returns out_dir."""
    import train

    def go(*args, config='shakespeare_add.py', out='out'):
        out_dir = tmp_path / out
        train.main([os.path.join(ROOT, 'config', config), *TINY, f'--data_dir={char_data}', f'--out_dir={out_dir}',
                    *args])
        return out_dir
    return go


def read_records(out_dir):
    """The records of out_dir/log.jsonl, or of a .jsonl file given itself."""
    path = out_dir if str(out_dir).endswith('.jsonl') else os.path.join(out_dir, 'log.jsonl')
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope='session')
def logs():
    """logs.records(out_dir): every log.jsonl record; logs.losses(out_dir): (iter, loss, val_loss)
    of each training and evaluation record; logs.evals(out_dir): (iter, val_loss) pairs."""
    return SimpleNamespace(records=read_records,
                           losses=lambda out_dir: [(r['iter'], r.get('loss'), r.get('val_loss'))
                                                   for r in read_records(out_dir) if 'event' not in r],
                           evals=lambda out_dir: [(r['iter'], r['val_loss']) for r in read_records(out_dir)
                                                  if 'val_loss' in r])


def descendants(pid):
    """The processes under pid (Linux): torchrun starts each worker in a session of its own."""
    found = []
    for task in os.listdir(f'/proc/{pid}/task'):
        with open(f'/proc/{pid}/task/{task}/children') as f:
            for child in map(int, f.read().split()):
                found += [child, *descendants(child)]
    return found


def alive(pid):
    """Whether process pid runs: a zombie (dead, not yet reaped) does not."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except FileNotFoundError:
        return False


def wait_gone(pids, timeout):
    """Seconds until none of pids runs; fails the test once timeout passes with one still running."""
    start = time.monotonic()
    while any(alive(p) for p in pids):
        if time.monotonic() - start > timeout:
            pytest.fail(f"processes {[p for p in pids if alive(p)]} still run {timeout} s on")
        time.sleep(0.05)
    return time.monotonic() - start


def kill_all(pids):
    """SIGKILL to each of pids still running: what a failed test leaves behind."""
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope='session')
def processes():
    """processes.descendants(pid); processes.wait_gone(pids, timeout) -> seconds; processes.kill_all(pids)."""
    return SimpleNamespace(descendants=descendants, wait_gone=wait_gone, kill_all=kill_all)


def launch(nproc, *args, timeout=240, env=None):
    """torchrun --standalone with nproc processes of train.py *args, in the repository's folder;
    returns the CompletedProcess. A run past timeout is aborted with every process's Python stack
    (faulthandler) in the failure, so that a hang says where it hung."""
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}', 'train.py',
           *map(str, args)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(env or os.environ, PYTHONFAULTHANDLER='1'))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stuck = descendants(proc.pid) + [proc.pid]
        for pid in stuck:
            os.kill(pid, signal.SIGABRT)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"torchrun ran past {timeout} s; its output, then the stacks of processes {stuck}:\n"
                    f"{out[-4000:]}\n{err[-12000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def table_cells(text):
    """{first cell: [the other cells]} of every row of the Markdown tables in text, headers left out."""
    lines = text.splitlines()
    heads = {a for a, b in zip(lines, lines[1:]) if b.startswith('|---')}
    rows = [[c.strip() for c in line.strip('|').split('|')] for line in lines if line.startswith('| ') and line not in heads]
    return {row[0]: row[1:] for row in rows}


def first_number(text):
    """The number a table cell starts with: '1,234 tok/s' -> 1234.0, '+5.2%' -> 5.2, '1.5x' -> 1.5."""
    return float(text.split()[0].replace(',', '').rstrip('%x'))


@pytest.fixture(scope='session')
def tables():
    """tables.cells(text): table_cells; tables.number(cell): first_number."""
    return SimpleNamespace(cells=table_cells, number=first_number)


class DiskFile(io.FileIO):
    """A file on a disk with `room` bytes left: a write past them fails with OSError(error)."""

    def __init__(self, path, mode, room, error):
        super().__init__(path, mode)
        self.room, self.error = room, error

    def write(self, data):
        if len(data) > self.room:
            raise OSError(self.error, os.strerror(self.error))
        self.room -= len(data)
        return super().write(data)


@pytest.fixture
def broken_disk(monkeypatch):
    """broken_disk(error, name, room=4096): from now on, the files that orthogpt writes (files.write_atomic:
    checkpoints, config.json; logs: log.jsonl; lock: .lock) whose name starts with `name` fail as on a
    broken disk, as root too: with EROFS (a read-only folder) at their open, with ENOSPC (full) or EIO
    once `room` bytes of them are written."""
    from orthogpt import files, lock, logs

    def fail(error, name, room=4096):
        def opener(path, mode='r', **kwargs):
            if mode.startswith('r') or not os.path.basename(path).startswith(name):
                return open(path, mode, **kwargs)
            if error == errno.EROFS:
                raise OSError(error, os.strerror(error), path)
            raw = DiskFile(path, mode.strip('bt+'), room, error)
            return raw if 'b' in mode else io.TextIOWrapper(io.BufferedWriter(raw))
        for module in (files, lock, logs):
            monkeypatch.setattr(module, 'open', opener, raising=False)
    return fail


class Terminal:
    """A process whose stdout and stderr are a pseudo-terminal, as in a user's shell: progress bars
    draw as they do there. read_until(text) collects its output until text appears (or it ends)."""

    def __init__(self, cmd, cwd):
        import fcntl
        import pty
        import struct
        import termios
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 120, 0, 0))  # 24 rows x 120 columns
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL,
                                     env=dict(os.environ, PYTHONUNBUFFERED='1'))
        os.close(slave)
        self.output = ''

    def read_until(self, text=None, timeout=120):
        import select
        deadline = time.monotonic() + timeout
        while (text is None or text not in self.output) and time.monotonic() < deadline:
            if select.select([self.master], [], [], 1)[0]:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # the process ended and closed the terminal
                    break
                if not chunk:
                    break
                self.output += chunk.decode(errors='replace')
        return self.output

    def finish(self, timeout=120):
        """The exit status, once the process has ended and its output is read."""
        code = self.proc.wait(timeout=timeout)
        self.read_until(None, timeout=5)
        os.close(self.master)
        return code


@pytest.fixture
def terminal(root):
    """terminal(*args): train.py with args, its output a pseudo-terminal (Terminal)."""
    started = []

    def start(*args):
        started.append(Terminal([sys.executable, 'train.py', *map(str, args)], root))
        return started[-1]
    yield start
    for t in started:
        if t.proc.poll() is None:
            t.proc.kill()
            t.finish()


@pytest.fixture(scope='session')
def torchrun():
    """torchrun(nproc, *train_py_args, timeout=240, env=None): a CompletedProcess; a hang fails
    with the stacks of the processes."""
    return launch


@pytest.fixture
def one_thread():
    """torch on one thread: generate() runs many forwards of a few small operations each, and on a busy machine two
    threads wait for each other far longer than such an operation computes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Slurm:
    """A one-node Slurm cluster of this machine's own, for this test process: munged (shared, started if none
    runs), a slurmctld and a slurmd on free ports, their configuration and state in `folder`. env: the
    environment that points Slurm's commands at it."""

    def __init__(self, folder, name, first_job=1):
        self.folder = folder
        ports = []
        for _ in range(2):
            s = socket.socket()
            s.bind(('127.0.0.1', 0))
            ports.append(s)
        ctld, node = (s.getsockname()[1] for s in ports)
        for s in ports:
            s.close()
        conf = folder / 'slurm.conf'
        conf.write_text('\n'.join([
            f'ClusterName={name}', 'SlurmctldHost=localhost(127.0.0.1)', 'SlurmUser=root', 'SlurmdUser=root',
            'AuthType=auth/munge', 'CredType=cred/munge', 'MpiDefault=none', 'ProctrackType=proctrack/linuxproc',
            'TaskPlugin=task/none', 'SchedulerType=sched/backfill', 'SelectType=select/cons_tres',
            'SelectTypeParameters=CR_Core', 'ReturnToService=2', 'JobRequeue=1', 'KillWait=10', 'MinJobAge=600',
            f'FirstJobId={first_job}',  # the job ids of this machine's clusters apart: a process names its job by id
            f'StateSaveLocation={folder}/state', f'SlurmdSpoolDir={folder}/spool', f'SlurmctldPort={ctld}',
            f'SlurmdPort={node}', f'SlurmctldPidFile={folder}/slurmctld.pid', f'SlurmdPidFile={folder}/slurmd.pid',
            f'NodeName={name} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} '
            f'RealMemory=1000 State=UNKNOWN',
            f'PartitionName=test Nodes={name} Default=YES MaxTime=INFINITE State=UP', '']))
        for sub in ('state', 'spool'):
            (folder / sub).mkdir()
        # its jobs run this Python (sbatch passes the environment on), one thread each, as torchrun's workers
        self.env = dict(os.environ, SLURM_CONF=str(conf), OMP_NUM_THREADS='1',
                        PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get('PATH', '')]))
        self.name = name

    def __call__(self, *cmd, check=True):
        done = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=60)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def start(self):
        """The daemons, up once the node takes jobs; a reason to skip where they cannot start."""
        if subprocess.run('munge -n | unmunge', shell=True, capture_output=True).returncode:
            os.makedirs('/run/munge', exist_ok=True)
            subprocess.run(['munged', '--force'], capture_output=True)
            if subprocess.run('munge -n | unmunge', shell=True, capture_output=True).returncode:
                return "munged does not run (Debian's munge package, and root to start it)"
        for daemon in (['slurmctld', '-L', str(self.folder / 'slurmctld.log')],
                       ['slurmd', '-N', self.name, '-L', str(self.folder / 'slurmd.log')]):
            done = subprocess.run([*daemon[:1], '-f', self.env['SLURM_CONF'], *daemon[1:]], capture_output=True,
                                  text=True, env=self.env)
            if done.returncode:
                return f"{daemon[0]} did not start: {done.stderr.strip()[-300:]}"
        deadline = time.monotonic() + 30
        while 'idle' not in self('sinfo', '--noheader', '--format=%T', check=False):
            if time.monotonic() > deadline:
                return f"the node never became idle: {self('sinfo', check=False)}"
            time.sleep(0.5)
        return None

    def stop(self):
        self('scontrol', 'shutdown', check=False)
        for pid_file in ('slurmctld.pid', 'slurmd.pid'):
            with suppress(OSError, ValueError):
                os.kill(int((self.folder / pid_file).read_text()), signal.SIGKILL)

    def submit(self, *args):
        """sbatch's job id."""
        return self('sbatch', '--parsable', *map(str, args)).strip().split(';')[0]

    def state(self, job, tries=20):
        """The job's state as squeue lists it, or None once it has left the queue. A busy slurmctld can time squeue
        out: that is asked again, not taken for a job that has left."""
        for _ in range(tries):
            done = subprocess.run(['squeue', '--noheader', '--format=%T', f'--jobs={job}'], capture_output=True,
                                  text=True, env=self.env, timeout=60)
            if done.returncode == 0:
                return done.stdout.strip() or None
            time.sleep(0.5)
        pytest.fail(f"squeue failed {tries} times: {done.stderr.strip()}")

    def wait(self, job, timeout=180):
        deadline = time.monotonic() + timeout
        while self.state(job):
            if time.monotonic() > deadline:
                pytest.fail(f"Slurm job {job} still {self.state(job)} after {timeout} s")
            time.sleep(0.5)

    def release(self, job, timeout=60):
        """A requeued job eligible at once, once it is pending again and its last run's processes are gone (its
        slurmstepd, `slurmstepd: [JOB.batch]`): Slurm holds a requeued job back for two minutes, and a job started
        again while its last run still ends fails at its start."""
        deadline = time.monotonic() + timeout
        while self.state(job) != 'PENDING' or subprocess.run(['pgrep', '-f', rf'slurmstepd: \[{job}\.'],
                                                             capture_output=True).returncode == 0:
            if time.monotonic() > deadline:
                pytest.fail(f"Slurm job {job} is {self.state(job)}, not pending again with its last run gone, "
                            f"{timeout} s on")
            time.sleep(0.2)
        # slurmd refuses a job started in the second its last run was killed ("Job credential revoked": a revocation
        # is kept to the second); Slurm's own hold is two minutes
        time.sleep(2)
        self('scontrol', 'update', f'jobid={job}', 'StartTime=now')


@pytest.fixture(scope='session')
def slurm(tmp_path_factory):
    """A one-node Slurm cluster (Slurm) for this test process (each pytest-xdist worker starts its own, on ports
    of its own); the tests that need it skip, saying why, where it cannot start: without Debian's slurm-wlm and
    munge, or without root."""
    import shutil
    missing = [b for b in ('slurmctld', 'slurmd', 'sbatch', 'munged') if not shutil.which(b)]
    if missing:
        pytest.skip(f"no {', '.join(missing)} here: Debian's slurm-wlm and munge packages (.ci/run installs them)")
    if os.geteuid() != 0:
        pytest.skip("a Slurm cluster of the tests' own starts as root")
    worker = os.environ.get('PYTEST_XDIST_WORKER', 'gw')
    cluster = Slurm(tmp_path_factory.mktemp('slurm'), f'orthogpt{worker}',
                    first_job=1000 * (1 + int(worker[2:] or 0)))
    why = cluster.start()
    if why:
        cluster.stop()
        pytest.skip(f"Slurm did not start: {why}")
    yield cluster
    cluster.stop()
