"""The one way files are written: atomically and durably, and what a failed write says.

write_atomic writes to a temporary name in the same folder, fsyncs it, renames it over the
destination and fsyncs the folder: a reader sees the old file or the new one, never half of one,
and a machine that loses power keeps one of the two. Checkpoints, token shards, prepared text and
cached images all go through it. A write that fails (a full disk, an I/O error, a read-only
folder) leaves the old file as it was, removes the temporary one, and raises a UserError that
names the file, the error and the free space left. A writer killed mid-write (SIGKILL, a lost
machine) leaves its temporary file; the folder's next lock holder removes it (remove_temporaries).
"""

import os
import re
import shutil
from contextlib import suppress

from orthogpt.errors import UserError


def write_atomic(path, write, mode='wb'):
    """Write `path` by calling write(file) on a temporary file opened with `mode`, then rename."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp, failed = temporary(path), None
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write as a RuntimeError
        failed = e
    finally:
        with suppress(OSError):  # nothing to remove, or a folder that lets nothing be removed
            os.remove(tmp)
    if failed is not None:  # told once the partial file is gone, so that the free space is what is left
        kept = (f"the previous {os.path.basename(path)} is kept as it was, the partial file removed"
                if os.path.exists(path) else "the partial file is removed")
        raise write_error(path, failed, kept)
    fsync_dir(folder)


def temporary(path):
    """The name a write of `path` goes to first (remove_temporaries knows its form)."""
    return f"{path}.tmp{os.getpid()}"


def remove_temporaries(folder):
    """Remove the temporary files in `folder` that killed writers left; called by the folder's one
    writer (orthogpt.lock), when no other process can be writing them."""
    for name in os.listdir(folder):
        if re.fullmatch(r'.+\.tmp\d+', name):
            with suppress(FileNotFoundError):
                os.remove(os.path.join(folder, name))


def write_error(path, error, kept):
    """The UserError of a failed write of `path`: the OSError behind `error` (torch.save's
    RuntimeError keeps it as its context), the free space where it went, and what is `kept`."""
    cause = error
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__context__
    what = f"{cause.strerror} (errno {cause.errno})" if cause is not None and cause.strerror else str(error)[:200]
    try:
        free = f"{size(shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free)} free there"
    except OSError:
        free = "its free space unknown"
    return UserError(f"could not write {path}: {what}, {free}; {kept}. Make room (or make the folder "
                     f"writable) and run again")


def size(n):
    """n bytes in GiB, MiB or KiB, whichever reads best."""
    for shift, unit in ((30, 'GiB'), (20, 'MiB')):
        if n >= 2 ** shift:
            return f"{n / 2 ** shift:.1f} {unit}"
    return f"{n / 2 ** 10:.1f} KiB"


def write_bytes(path, data):
    write_atomic(path, lambda f: f.write(data))


def write_text(path, text):
    write_atomic(path, lambda f: f.write(text), mode='w')


def link_atomic(src, dst):
    """Make dst the same file as src (a hard link where the file system allows, else a copy), atomically."""
    tmp = temporary(dst)
    try:
        os.link(src, tmp)
    except OSError:  # no hard links here
        with open(src, 'rb') as source:
            write_atomic(dst, lambda f: shutil.copyfileobj(source, f, 1 << 24))
        return
    os.replace(tmp, dst)


def fsync_dir(folder):
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
