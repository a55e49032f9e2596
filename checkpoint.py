"""Checkpoint files: written atomically, read with weights_only=True, metadata as JSON."""

import json
import os

import torch


class CheckpointError(RuntimeError):
    pass


def save(obj, path):
    """torch.save to a temporary file in the same folder, fsync, then rename over `path`:
    a reader sees the old file or the new one, never half of one."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, 'wb') as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_or_copy(src, dst):
    """Make dst the same checkpoint as src (a hard link where the file system allows), atomically."""
    tmp = f"{dst}.tmp{os.getpid()}"
    try:
        os.link(src, tmp)
    except OSError:
        with open(src, 'rb') as fi, open(tmp, 'wb') as fo:
            while chunk := fi.read(1 << 24):
                fo.write(chunk)
            fo.flush()
            os.fsync(fo.fileno())
    os.replace(tmp, dst)


def load(path, map_location='cpu'):
    """A checkpoint dict with 'config' (and 'meta', if saved) decoded from JSON."""
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}; train one first (python train.py CONFIG) "
                              f"or point --out_dir at the folder holding ckpt.pt")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
        ckpt['config'] = json.loads(ckpt['config'])
        if ckpt.get('meta') is not None:
            ckpt['meta'] = json.loads(ckpt['meta'])
        ckpt['model']
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable checkpoint (truncated, corrupt or not ours: "
                              f"{type(e).__name__}: {str(e)[:200]}); delete it or use another one "
                              f"(ckpt.pt is the latest, best.pt the best so far)") from None
    return ckpt
