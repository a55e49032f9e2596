"""One writer per folder: train.py holds a lock on its out_dir, tools/compare.py one on its --out,
and a second writer is refused at once with the first one's pid, host, start time and command.

The lock is fcntl.flock on FOLDER/.lock, which the operating system releases when its holder's
file descriptor closes: at exit, at a crash or at SIGKILL alike, so a dead writer never leaves a
stale lock. The file holds the holder's details for the refusal to name. A holder that ends
removes the file while it still holds it; one that was killed leaves it, unlocked, for the next
writer to take, with any temporary file a killed writer left mid-write, which the new holder
removes. Readers (sample.py, tools/export.py, the plots) take no lock.
"""

import fcntl
import json
import os
import shlex
import socket
import sys
import time
from contextlib import suppress

from orthogpt.errors import UserError
from orthogpt.files import remove_temporaries, write_error

NAME = '.lock'


class Held:
    """The lock on a folder, held until release() (or the end of a `with` block, or the process)."""

    def __init__(self, file, path):
        self.file, self.path = file, path

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def release(self):
        # removed before it is unlocked: a writer that opened it meanwhile finds it gone and opens anew
        with suppress(OSError):
            os.remove(self.path)
        with suppress(OSError):  # the details that a full disk did not take, which raised already
            self.file.close()


def hold(folder):
    """The lock on `folder` (created if missing), or a UserError naming the process that holds it."""
    path = os.path.join(folder, NAME)
    while True:
        try:
            os.makedirs(folder, exist_ok=True)
            f = open(path, 'a+')
        except OSError as e:  # a read-only folder, say
            raise write_error(path, e, "nothing was written") from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read()
            f.close()
            raise UserError(refusal(folder, holder)) from None
        if current(f, path):
            break
        f.close()  # its holder removed it between our open and our lock: the folder's lock is a new file
    held = Held(f, path)
    try:
        f.truncate(0)
        f.write(json.dumps({'pid': os.getpid(), 'host': socket.gethostname(),
                            'started': time.strftime('%Y-%m-%d %H:%M:%S'), 'command': shlex.join(sys.orig_argv)}) + '\n')
        f.flush()
    except OSError as e:  # a full disk: the run could write nothing else either
        held.release()
        raise write_error(path, e, "nothing was written") from None
    remove_temporaries(folder)
    return held


def current(f, path):
    """Whether the open file f is still the file at path."""
    try:
        return os.path.samestat(os.fstat(f.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


def refusal(folder, holder):
    try:
        h = json.loads(holder)
        who = f"pid {h['pid']} on {h['host']}, started {h['started']}, command: {h['command']}"
        stop = f"kill {h['pid']}"
    except (ValueError, KeyError, TypeError):  # its holder has locked it but not yet written its details
        who, stop = "a process that is starting", "kill it"
    return (f"{folder} is in use by another run: {who}; wait for it to end, stop it ({stop}: a training run saves a "
            f"checkpoint first), or use another folder")
