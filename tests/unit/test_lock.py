"""The lock on a folder (orthogpt/lock.py): a second writer refused with the first one's details,
no stale lock after a SIGKILL, the temporary file of a writer killed mid-write removed by the next
holder, a lock released while another process opens it taken once, and a folder that cannot hold one."""

import errno
import fcntl
import os
import shlex
import signal
import socket
import subprocess
import sys

import pytest

from orthogpt import lock
from orthogpt.errors import UserError


def test_a_second_holder_is_refused_with_the_first_ones_details(tmp_path):
    folder = tmp_path / 'out'
    with lock.hold(folder):  # a lock on an open file: a second open of it conflicts, in one process too
        with pytest.raises(UserError) as e:
            lock.hold(folder)
    msg = str(e.value)
    assert msg.startswith(f"{folder} is in use by another run: pid {os.getpid()} on {socket.gethostname()}, started 2")
    assert f"command: {shlex.join(sys.orig_argv)};" in msg and f"kill {os.getpid()}" in msg
    assert msg.endswith('or use another folder')
    assert not os.listdir(folder), "a holder that ends removes the lock file"
    lock.hold(folder).release()


def test_a_killed_holder_leaves_no_stale_lock(root, tmp_path):
    """The operating system releases the lock of a SIGKILLed holder: its file stays, unlocked."""
    code = ('import sys, time; from orthogpt import lock; held = lock.hold(sys.argv[1]); print("held", flush=True); '
            'time.sleep(120)')
    holder = subprocess.Popen([sys.executable, '-c', code, str(tmp_path)], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == 'held\n'
        with pytest.raises(UserError, match=f"in use by another run: pid {holder.pid} on .*, command: .* -c 'import"):
            lock.hold(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert os.listdir(tmp_path) == ['.lock']
    lock.hold(tmp_path).release()


def test_a_writer_killed_mid_write_leaves_its_file_whole_and_its_temporary_to_the_next_holder(root, tmp_path):
    """SIGKILL during files.write_atomic: the file keeps its old contents, and the half-written
    temporary that the killed process left is removed when the folder's lock is next taken."""
    (tmp_path / 'results.md').write_text('old\n')
    code = ('import sys, time; from orthogpt import files, lock; held = lock.hold(sys.argv[1]); '
            'files.write_atomic(sys.argv[1] + "/results.md", lambda f: (f.write("ne"), f.flush(), print("writing", flush=True), '
            'time.sleep(120)), mode="w")')
    writer = subprocess.Popen([sys.executable, '-c', code, str(tmp_path)], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == 'writing\n'
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    left = f'results.md.tmp{writer.pid}'
    assert sorted(os.listdir(tmp_path)) == ['.lock', 'results.md', left] and (tmp_path / left).read_text() == 'ne'
    assert (tmp_path / 'results.md').read_text() == 'old\n'
    with lock.hold(tmp_path):
        assert sorted(os.listdir(tmp_path)) == ['.lock', 'results.md']


def test_a_lock_released_while_another_opens_it_is_taken_once(tmp_path, monkeypatch):
    """A takes the lock; B opens the lock file; A releases it (removing the file) and C takes a new
    one; only then does B lock the file it opened, which is no longer the folder's: B tries again
    and is refused by C."""
    a, taken = lock.hold(tmp_path), []
    real = fcntl.flock

    def late(f, op):  # B's first flock: A and C go between B's open and B's lock
        monkeypatch.setattr(fcntl, 'flock', real)
        a.release()
        taken.append(lock.hold(tmp_path))
        return real(f, op)
    monkeypatch.setattr(fcntl, 'flock', late)
    with pytest.raises(UserError, match='in use by another run'):
        lock.hold(tmp_path)
    assert len(taken) == 1 and os.path.exists(tmp_path / '.lock')
    taken[0].release()


@pytest.mark.parametrize('error,what', [(errno.EROFS, 'Read-only file system'), (errno.ENOSPC, 'No space left')],
                         ids=['read-only', 'full'])
def test_a_folder_that_cannot_hold_the_lock_says_so(tmp_path, broken_disk, error, what):
    """A read-only out_dir, or a full disk that takes not even the holder's details, stops a run
    before anything else, with the lock let go."""
    broken_disk(error, '.lock', room=0)
    with pytest.raises(UserError, match=f"could not write {tmp_path / '.lock'}: {what}.* free there; nothing was "
                                        f"written"):
        lock.hold(tmp_path)
    assert not os.listdir(tmp_path)
