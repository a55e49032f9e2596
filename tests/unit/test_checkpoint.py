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
    with pytest.raises(UserError) as e:
        checkpoint.load_latest(str(tmp_path))
    assert str(e.value).startswith(f"no checkpoint in {tmp_path} verifies: {tmp_path / 'ckpt.pt'} is not a readable "
                                   f"checkpoint (truncated, corrupt or not ours: UnpicklingError: Weights only load "
                                   f"failed.")
    assert '\n' not in str(e.value) and str(e.value).endswith('; start again in another --out_dir')


def test_a_librarys_long_message_is_cut_at_a_sentence_on_one_line():
    from orthogpt.errors import one_line
    torch_says = ("PytorchStreamReader failed reading zip archive: failed finding central directory. This is an "
                  "internal miniz error. If you are seeing this error, there is a high likelihood that your checkpoint "
                  "file is\ncorrupted. This can happen if the checkpoint was not saved properly.")
    assert one_line(torch_says) == ("PytorchStreamReader failed reading zip archive: failed finding central "
                                    "directory. This is an internal miniz error.")
    assert one_line(torch_says, limit=1000) == ' '.join(torch_says.split())  # short enough: whole, on one line
    assert one_line('x' * 300 + '. Then more.') == 'x' * 300 + '.'  # the first sentence whole, however long
    assert one_line('[Errno 22] Invalid argument') == '[Errno 22] Invalid argument'


def state(iter_num, best=False):
    return {'iter_num': iter_num, 'sharded': None, 'config': '{}', 'meta': None, 'best': best,
            'model': {'w': torch.randn(1000)}}


def saved(folder, iter_num, best, keep_last_n=2):
    """A run's save at iter_num: ckpt.pt, then what retain keeps."""
    checkpoint.save(state(iter_num, best), folder / 'ckpt.pt')
    checkpoint.retain(folder, iter_num, keep_last_n, best)


def truncate(path):
    """Cut the file in half in place, as a full disk or a copy cut short leaves it: every hard link to it too."""
    with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) // 2)


def test_retention_moves_damaged_files_aside_and_keeps_the_newest_that_verify(tmp_path, capsys):
    """The trial's sequence: saves at 1750 and 2000 (both best: ckpt.pt, best.pt and ckpt-0002000.pt one file); that
    file truncated; resume takes 1750; the next save (1905, not best) keeps 1750, moves the damaged names aside and
    points best.pt at 1750, the newest checkpoint saved as the best that verifies."""
    saved(tmp_path, 1750, best=True)
    saved(tmp_path, 2000, best=True)
    assert os.path.samefile(tmp_path / 'best.pt', tmp_path / 'ckpt.pt')
    truncate(tmp_path / 'ckpt.pt')
    ckpt, path, refused = checkpoint.load_latest(tmp_path)
    assert path == str(tmp_path / 'ckpt-0001750.pt') and [[os.path.basename(p) for p in names] for names, _ in
                                                            refused] == [['ckpt.pt', 'ckpt-0002000.pt']]
    capsys.readouterr()
    saved(tmp_path, 1905, best=False)
    printed = capsys.readouterr().out.splitlines()
    assert sorted(os.listdir(tmp_path)) == ['best.pt', 'ckpt-0001750.pt', 'ckpt-0001905.pt', 'ckpt.pt', 'damaged']
    assert sorted(os.listdir(tmp_path / 'damaged')) == ['best.pt', 'ckpt-0002000.pt']
    assert os.path.samefile(tmp_path / 'best.pt', tmp_path / 'ckpt-0001750.pt')
    assert len(printed) == 2 and printed[0].startswith(f"warning: {tmp_path / 'ckpt-0002000.pt'} is not a readable "
                                                       f"checkpoint (truncated, corrupt or not ours: ")
    assert printed[0].endswith(f") (the same file as best.pt); moved into {tmp_path / 'damaged'}/, where nothing reads it")
    assert printed[1] == ("best.pt is now ckpt-0001750.pt (iteration 1750), the newest checkpoint saved as the best "
                          "that verifies")
    saved(tmp_path, 1950, best=False)  # retention by recency again: 1750 goes now that nothing damaged is kept
    assert sorted(os.listdir(tmp_path)) == ['best.pt', 'ckpt-0001905.pt', 'ckpt-0001950.pt', 'ckpt.pt', 'damaged']
    assert checkpoint.load(tmp_path / 'best.pt')['iter_num'] == 1750  # its other names gone, best.pt keeps it


def test_a_damaged_best_with_no_verified_best_leaves_no_best_and_a_changed_byte_is_caught(tmp_path, capsys):
    saved(tmp_path, 10, best=True, keep_last_n=1)
    saved(tmp_path, 20, best=False, keep_last_n=1)
    assert sorted(os.listdir(tmp_path)) == ['best.pt', 'ckpt-0000020.pt', 'ckpt.pt']
    data = bytearray((tmp_path / 'best.pt').read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / 'best.pt').write_bytes(data)
    capsys.readouterr()
    saved(tmp_path, 30, best=False, keep_last_n=1)
    assert capsys.readouterr().out.splitlines()[-1].startswith("no checkpoint that verifies was saved as the best")
    assert sorted(os.listdir(tmp_path)) == ['ckpt-0000030.pt', 'ckpt.pt', 'damaged']
    saved(tmp_path, 30, best=False, keep_last_n=1)  # a name taken in damaged/ is kept, the new one numbered
    (tmp_path / 'best.pt').write_bytes(b'damaged again')
    saved(tmp_path, 40, best=False, keep_last_n=1)
    assert sorted(os.listdir(tmp_path / 'damaged')) == ['best.pt', 'best.pt.1']


def test_a_reader_falls_back_from_a_damaged_default_and_refuses_a_damaged_choice(tmp_path, capsys):
    saved(tmp_path, 10, best=True)
    saved(tmp_path, 20, best=True)
    truncate(tmp_path / 'best.pt')  # ckpt.pt and ckpt-0000020.pt with it
    ckpt, path = checkpoint.load_chosen(tmp_path)
    assert ckpt['iter_num'] == 10 and path == str(tmp_path / 'ckpt-0000010.pt')
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"warning: {tmp_path / 'best.pt'} is not a readable checkpoint (") and line.endswith(
        f"(the same file as ckpt.pt and ckpt-0000020.pt); using {path} (iteration 10), the newest checkpoint that "
        f"verifies")
    with pytest.raises(UserError) as e:
        checkpoint.load_chosen(tmp_path, 'best.pt')
    assert '\n' not in str(e.value) and str(e.value).endswith(
        "; these verify: ckpt-0000010.pt (iteration 10); pass one with --ckpt")
    with pytest.raises(UserError, match=r"^no checkpoint at .*nope.pt; these verify: ckpt-0000010.pt \(iteration 10\)"):
        checkpoint.load_chosen(tmp_path, 'nope.pt')
    with pytest.raises(UserError, match='^no checkpoint in .*elsewhere; train one first'):
        checkpoint.load_chosen(tmp_path / 'elsewhere')


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


def test_weights_from_a_model_py_that_built_other_parameters_are_refused_in_one_line(gpt_config, tmp_path):
    """An Attention Residuals checkpoint from before its first sublayer lost the query and norm that never trained."""
    from model import GPT
    model = GPT(gpt_config(residual='attnres'))
    state = model.state_dict()
    state['blocks.0.update_attn.query'] = torch.zeros(16)
    with pytest.raises(UserError) as e:
        checkpoint.load_weights(model, {'sharded': None, 'model': state}, str(tmp_path / 'ckpt.pt'))
    assert str(e.value) == (f"{tmp_path / 'ckpt.pt'} and this model.py disagree on the parameters of its config: "
                            f"blocks.0.update_attn.query; the checkpoint was written by another version of model.py, "
                            f"so load it with that version")
