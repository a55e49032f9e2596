"""The one way files are written: atomically and durably.

write_atomic writes to a temporary name in the same folder, fsyncs it, renames it over the
destination and fsyncs the folder: a reader sees the old file or the new one, never half of one,
and a machine that loses power keeps one of the two. Checkpoints, token shards, prepared text and
cached images all go through it.
"""

import os
import shutil


def write_atomic(path, write, mode='wb'):
    """Write `path` by calling write(file) on a temporary file opened with `mode`, then rename."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    fsync_dir(folder)


def write_bytes(path, data):
    write_atomic(path, lambda f: f.write(data))


def write_text(path, text):
    write_atomic(path, lambda f: f.write(text), mode='w')


def link_atomic(src, dst):
    """Make dst the same file as src (a hard link where the file system allows, else a copy), atomically."""
    tmp = f"{dst}.tmp{os.getpid()}"
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
