"""Checkpoint files and random states: what an exact, safe resume rests on."""

import os
import random

import numpy as np
import pytest
import torch

from orthogpt import checkpoint
from orthogpt.errors import UserError
from orthogpt.rng import rng_state, set_rng_state


def test_rng_state_round_trip_covers_numpy_and_python():
    state = rng_state('cpu')
    draws = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(state)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(draws[0], again[0]) and np.array_equal(draws[1], again[1]) and draws[2] == again[2]



def test_no_usable_checkpoint(tmp_path):
    (tmp_path / 'ckpt.pt').write_bytes(b'not a checkpoint')
    with pytest.raises(UserError, match='no usable checkpoint'):
        checkpoint.load_latest(str(tmp_path))


def test_a_checkpoint_of_another_format_is_refused(tmp_path):
    checkpoint.save({'iter_num': 3, 'sharded': None, 'config': '{}', 'meta': None}, tmp_path / 'ckpt.pt')
    assert checkpoint.load(tmp_path / 'ckpt.pt')['iter_num'] == 3
    saved = torch.load(tmp_path / 'ckpt.pt', weights_only=True)
    del saved['checksum']
    saved['format'] = checkpoint.FORMAT + 1
    saved['checksum'] = checkpoint.checksum(saved)
    torch.save(saved, tmp_path / 'ckpt.pt')
    with pytest.raises(UserError, match=f"format {checkpoint.FORMAT + 1}, written by another version"):
        checkpoint.load(tmp_path / 'ckpt.pt')


def test_a_save_is_atomic_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A write that fails halfway leaves the old checkpoint as it was."""
    checkpoint.save({'iter_num': 1, 'sharded': None, 'config': '{}', 'meta': None}, tmp_path / 'ckpt.pt')
    before = (tmp_path / 'ckpt.pt').read_bytes()

    def broken(obj, f):
        f.write(b'half a checkpoint')
        raise OSError('disk full')
    monkeypatch.setattr(torch, 'save', broken)
    with pytest.raises(UserError, match='could not write .*ckpt.pt: disk full'):
        checkpoint.save({'iter_num': 2, 'sharded': None, 'config': '{}', 'meta': None}, tmp_path / 'ckpt.pt')
    assert (tmp_path / 'ckpt.pt').read_bytes() == before and os.listdir(tmp_path) == ['ckpt.pt']


def test_resume_refuses_an_option_that_changes_the_parameters_and_keeps_one_that_does_not():
    """An mHC run resumed with another H_res constraint builds other coefficients: refused, naming the option; with
    recomputation switched on it builds the same ones, and continues."""
    import configure
    from orthogpt import resume
    saved = configure.load(['--residual=mhc'])
    (why,) = resume.problems(saved, configure.load(['--residual=mhc', '--mhc_res=permutation']))
    assert why.startswith("mhc_res 'sinkhorn' -> 'permutation': the two settings of 'mhc' build different parameters")
    assert resume.problems(saved, configure.load(['--residual=mhc', '--hc_recompute=True'])) == []
