"""Faults injected into one writer or reader at a time: a full disk, an I/O error and a read-only
folder under a checkpoint, a sharded checkpoint and a log; a log line cut in half; a sharded
checkpoint's folder with a file missing, truncated or changed. tests/e2e/test_reliability.py
injects them into whole runs."""

import errno
import json
import os
import re

import pytest
import torch

from orthogpt import checkpoint, logs, sharded
from orthogpt.errors import UserError

FAULTS = pytest.mark.parametrize('error', [errno.ENOSPC, errno.EIO, errno.EROFS], ids=errno.errorcode.get)


def state(iter_num, folder=None):
    return {'iter_num': iter_num, 'sharded': folder, 'config': '{}', 'meta': None, 'model': {'w': torch.randn(5000)}}


def says_what_failed(msg, path, error):
    """The message names the file, the error and the free space."""
    return (msg.startswith(f"could not write {path}: {os.strerror(error)} (errno {error}), ")
            and re.search(r'[\d.]+ [GMK]iB free there', msg) is not None and msg.endswith('run again'))


@FAULTS
def test_a_failed_checkpoint_write_keeps_the_previous_one(tmp_path, broken_disk, error):
    checkpoint.save(state(1), tmp_path / 'ckpt.pt')
    before = (tmp_path / 'ckpt.pt').read_bytes()
    broken_disk(error, 'ckpt.pt')
    with pytest.raises(UserError) as e:
        checkpoint.save(state(2), tmp_path / 'ckpt.pt')
    assert says_what_failed(str(e.value), tmp_path / 'ckpt.pt', error), e.value
    assert 'the previous ckpt.pt is kept as it was, the partial file removed' in str(e.value)
    assert (tmp_path / 'ckpt.pt').read_bytes() == before and os.listdir(tmp_path) == ['ckpt.pt']
    assert checkpoint.load(tmp_path / 'ckpt.pt')['iter_num'] == 1


@pytest.fixture
def fsdp_like(tmp_path, gpt_config):
    """save(iter_num): a small GPT's model and AdamW state saved as an FSDP run saves them, in one
    process: a ckpt-<iter>.dcp folder, then ckpt.pt (and ckpt-<iter>.pt) naming it."""
    from model import GPT
    model = GPT(gpt_config())
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))[1].backward()
    optimizer.step()

    def save(iter_num):
        folder, written = sharded.save(model, [optimizer], tmp_path, iter_num, True)
        written()
        checkpoint.save(state(iter_num, folder), tmp_path / 'ckpt.pt')
        checkpoint.retain(tmp_path, iter_num, 2, False)
    return save


@pytest.mark.filterwarnings('ignore:torch.distributed is disabled')
def test_a_failed_sharded_write_keeps_the_checkpoints_saved_before(tmp_path, fsdp_like, monkeypatch):
    fsdp_like(4)

    def broken(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(os, 'fsync', broken)
    with pytest.raises(UserError) as e:
        fsdp_like(8)
    assert says_what_failed(str(e.value), tmp_path / 'ckpt-0000008.dcp', errno.EIO), e.value
    assert 'the checkpoints saved before are kept as they were, the partial folder removed' in str(e.value)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ['ckpt-0000004.dcp', 'ckpt-0000004.pt', 'ckpt.pt']
    assert checkpoint.load(tmp_path / 'ckpt.pt')['iter_num'] == 4


def flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(data)


@pytest.mark.filterwarnings('ignore:torch.distributed is disabled')
@pytest.mark.parametrize('damage,expected', [
    (lambda f: f.unlink(), 'whose file __0_0.distcp is missing'),
    (lambda f: f.write_bytes(f.read_bytes()[:-100]), r'whose file __0_0.distcp holds [\d,]+ bytes, not the [\d,]+ '
                                                     r'written \(truncated\?\)'),
    (flip, 'whose file __0_0.distcp fails its checksum'),
], ids=['missing', 'truncated', 'changed'])
def test_a_damaged_sharded_checkpoint_is_refused_and_the_one_before_taken(tmp_path, fsdp_like, damage, expected):
    fsdp_like(4)
    fsdp_like(8)
    damage(tmp_path / 'ckpt-0000008.dcp' / '__0_0.distcp')
    with pytest.raises(UserError, match=f"ckpt.pt names {tmp_path / 'ckpt-0000008.dcp'}, {expected}"):
        checkpoint.load(tmp_path / 'ckpt.pt')
    ckpt, path, refused = checkpoint.load_latest(tmp_path)
    assert ckpt['iter_num'] == 4 and path == str(tmp_path / 'ckpt-0000004.pt')
    assert [[os.path.basename(p) for p in names] for names, _ in refused] == [['ckpt.pt', 'ckpt-0000008.pt']]


def test_a_log_line_cut_in_half_is_dropped_with_a_warning(tmp_path, capsys):
    """Glued to the next one (a writer that died mid-line, then another's line), and at the end."""
    path = tmp_path / 'log.jsonl'
    lines = [json.dumps({'iter': i, 'loss': 4.0 - i / 10}) for i in (5, 10, 15, 20, 25)]
    path.write_text(f"{lines[0]}\n{lines[1][:12]}{lines[2]}\n{lines[3]}\n{lines[4][:12]}")
    assert [r['iter'] for r in logs.read(str(tmp_path))] == [5, 20]
    assert capsys.readouterr().out.splitlines() == [
        f"warning: {path} line 2 is not a whole record, dropped: {(lines[1][:12] + lines[2])[:80]!r}",
        f"warning: {path} line 4 is not a whole record, dropped: {lines[4][:12]!r}"]
    logs.read(str(tmp_path))
    assert capsys.readouterr().out == '', "each damaged line is reported once"
    f = logs.reopen(str(path), 20)  # a resume from iteration 20
    f.write(json.dumps({'iter': 25}) + '\n')
    f.close()
    assert path.read_text() == f"{lines[0]}\n{lines[3]}\n" + json.dumps({'iter': 25}) + '\n'


def test_a_full_disk_under_the_log_stops_the_run_with_its_records_kept(tmp_path, broken_disk, capsys):
    from types import SimpleNamespace
    broken_disk(errno.ENOSPC, 'log.jsonl', room=300)
    log = logs.RunLog(SimpleNamespace(out_dir=str(tmp_path), dynamics=False, wandb_log=False), True, 0)
    with pytest.raises(UserError) as e:
        for i in range(100):
            log.write({'iter': i, 'loss': 1.0})
    log.close()
    assert says_what_failed(str(e.value), tmp_path / 'log.jsonl', errno.ENOSPC), e.value
    assert 'the records written before are kept' in str(e.value)
    assert [r['iter'] for r in logs.read(str(tmp_path))] == list(range(i))


def test_a_repeated_sigterm_still_asks_to_stop_and_a_second_ctrl_c_kills():
    """A dying launcher's parent-death SIGTERM comes once per thread of the launcher: the first and the later ones
    ask the same stop, and none takes the default action (which would kill the worker before it saves). After a
    SIGINT the usual handlers are back, so that Ctrl-C twice still kills."""
    import signal

    from orthogpt.signals import Interrupt
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    interrupt = Interrupt()
    try:
        for _ in range(3):
            os.kill(os.getpid(), signal.SIGTERM)
        assert interrupt.signum == signal.SIGTERM and signal.getsignal(signal.SIGTERM) == interrupt.handle
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupt.signum == signal.SIGTERM  # the first signal's request stands
        assert {s: signal.getsignal(s) for s in before} == before
    finally:
        interrupt.restore()
