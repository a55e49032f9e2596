"""Fixtures shared by the test modules (which never import each other)."""

import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# a 2-layer model that trains in seconds on the CPU; tests add the keys they exercise
TINY = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=8', '--eval_iters=4',
        '--log_interval=5', '--warmup_iters=5', '--learning_rate=1e-2', '--device=cpu', '--compile=False']


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


@pytest.fixture(scope='session')
def root():
    """The repository's folder."""
    return ROOT


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
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
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


@pytest.fixture(scope='session')
def torchrun():
    """torchrun(nproc, *train_py_args, timeout=240, env=None): a CompletedProcess; a hang fails
    with the stacks of the processes."""
    return launch
