"""Checkpoint files: written atomically, verified on load, read with weights_only=True.

A checkpoint is a dict saved by torch.save; its metadata ('config', 'meta') is JSON text. save()
adds 'checksum', a SHA-256 over every tensor and string in it (torch.load checks no checksum of
its own: a flipped byte in tensor data loads silently), and load() refuses a file whose
checksum does not match, or that does not unpickle (truncated, not a checkpoint).

In an out_dir: ckpt.pt is the latest, ckpt-<iter>.pt the last keep_last_n saves (hard links, so
the newest costs no space) and best.pt the one with the best val loss. load_latest() takes the
newest of them that verifies. A run with parallel='fsdp' keeps its model and optimizer state in
ckpt-<iter>.dcp folders instead, written by every process with torch.distributed.checkpoint and
readable on any number of processes; the checkpoint file names its folder ('sharded').
"""

import glob
import hashlib
import json
import os
import shutil
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import configure
from model import GPT


class CheckpointError(RuntimeError):
    pass


def checksum(obj):
    """SHA-256 over the tensors, strings and numbers of a nested dict/list, in order."""
    h = hashlib.sha256()

    def visit(x):
        if torch.is_tensor(x):
            t = x.detach().cpu()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(x, dict):
            for k, v in x.items():
                visit(k)
                visit(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                visit(v)
        else:
            h.update(repr(x).encode())
    visit(obj)
    return h.hexdigest()


def save(obj, path):
    """torch.save to a temporary file in the same folder, fsync, then rename over `path`:
    a reader sees the old file or the new one, never half of one."""
    obj = dict(obj, checksum=checksum(obj))
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
    fsync_dir(folder)


def fsync_dir(folder):
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link(src, dst):
    """Make dst the same file as src (a hard link where the file system allows, else a copy), atomically."""
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


def snapshot(out_dir, iter_num, keep_last_n):
    """Keep ckpt.pt as ckpt-<iter>.pt too, and only the newest keep_last_n of those."""
    if keep_last_n < 1:
        return
    link(os.path.join(out_dir, 'ckpt.pt'), os.path.join(out_dir, f'ckpt-{iter_num:07d}.pt'))
    for old in snapshots(out_dir)[keep_last_n:]:
        os.remove(old)
    fsync_dir(out_dir)


def snapshots(out_dir):
    """ckpt-<iter>.pt files, newest first."""
    return sorted(glob.glob(os.path.join(out_dir, 'ckpt-[0-9]*.pt')), reverse=True)


def load(path, map_location='cpu'):
    """A verified checkpoint dict with 'config' (and 'meta', if saved) decoded from JSON."""
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}; train one first (python train.py CONFIG) "
                              f"or point --out_dir at the folder holding ckpt.pt")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
        stored = ckpt.pop('checksum')
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable checkpoint (truncated, corrupt or not ours: "
                              f"{type(e).__name__}: {str(e)[:200]})") from None
    if checksum(ckpt) != stored:
        raise CheckpointError(f"{path} fails its checksum: its contents changed after it was written")
    sharded = ckpt.get('sharded') and os.path.join(os.path.dirname(path), ckpt['sharded'])
    if sharded and not os.path.exists(os.path.join(sharded, '.metadata')):
        raise CheckpointError(f"{path} names {sharded}, which is missing or incomplete")
    ckpt['config'] = json.loads(ckpt['config'])
    if ckpt.get('meta') is not None:
        ckpt['meta'] = json.loads(ckpt['meta'])
    return ckpt


def load_latest(out_dir, map_location='cpu'):
    """(checkpoint, path, refused): the newest of ckpt.pt, ckpt-<iter>.pt, best.pt that verifies;
    refused lists (path, reason) for the newer ones that did not."""
    candidates = [os.path.join(out_dir, 'ckpt.pt')] + snapshots(out_dir) + [os.path.join(out_dir, 'best.pt')]
    refused = []
    for path in (p for p in candidates if os.path.exists(p)):
        try:
            return load(path, map_location), path, refused
        except CheckpointError as e:
            refused.append((path, str(e)))
    if not refused:
        raise CheckpointError(f"no checkpoint in {out_dir}; train one first (python train.py CONFIG) "
                              f"or point --out_dir at the folder holding ckpt.pt")
    raise CheckpointError("no usable checkpoint in " + out_dir + ":\n  " + "\n  ".join(r for _, r in refused))


def load_language_model(out_dir, name=None, map_location='cpu'):
    """(GPT in eval mode, its checkpoint, its Config) from out_dir/name (default: best.pt, else
    ckpt.pt); an image classifier's checkpoint is refused."""
    name = name or ('best.pt' if os.path.exists(os.path.join(out_dir, 'best.pt')) else 'ckpt.pt')
    path = os.path.join(out_dir, name)
    ckpt = load(path, map_location)
    try:
        cfg = configure.from_dict(ckpt['config'])
    except configure.ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None
    if ckpt.get('meta') and 'itos' not in ckpt['meta']:
        raise CheckpointError(f"{path} is an image classifier ({ckpt['meta'].get('dataset')}), not a language model")
    model = GPT(configure.model_config(cfg))
    load_weights(model, ckpt, path)
    return model.eval(), ckpt, cfg


def load_weights(model, ckpt, path, optimizer=None):
    """The weights of the checkpoint `ckpt`, read from `path`, into model (and, unless None, its
    optimizer's state into optimizer): from the file itself, or from the ckpt-<iter>.dcp folder it
    names."""
    if ckpt.get('sharded'):
        load_sharded(model, optimizer, os.path.join(os.path.dirname(path), ckpt['sharded']))
        return
    model.load_state_dict(ckpt['model'])
    if optimizer is not None:
        optimizer.load_state_dict(ckpt['optimizer'])


def save_sharded(model, optimizer, out_dir, iter_num, master):
    """Every process's shards of the model and optimizer state, written together into
    out_dir/ckpt-<iter>.dcp (torch.distributed.checkpoint); returns the folder's name. They go to a
    temporary folder first, which rank 0 renames once all are written (dcp.save's last step is
    collective): a reader finds a whole folder or none."""
    name = f'ckpt-{iter_num:07d}.dcp'
    folder, tmp = os.path.join(out_dir, name), os.path.join(out_dir, name + '.tmp')
    model_state, optim_state = get_state_dict(model, list(optimizer))
    dcp.save({'model': model_state, 'optimizer': optim_state}, checkpoint_id=tmp)
    if master:
        if os.path.exists(folder):  # saved at this iteration before (an evaluation cut short, then resumed)
            shutil.rmtree(folder)
        os.replace(tmp, folder)
        fsync_dir(out_dir)
    return name


def load_sharded(model, optimizer, folder):
    """Load a ckpt-<iter>.dcp folder into model (sharded over any number of processes, or whole)
    and, unless None, its optimizer."""
    model_state, optim_state = get_state_dict(model, list(optimizer or []))
    state = {'model': model_state, **({'optimizer': optim_state} if optimizer else {})}
    with warnings.catch_warnings():  # that one process loads the shards of several is what is meant here
        warnings.filterwarnings('ignore', message='torch.distributed is disabled')
        dcp.load(state, checkpoint_id=folder)
    set_state_dict(model, list(optimizer or []), model_state_dict=state['model'],
                   optim_state_dict=state.get('optimizer', {}))
    if optimizer:
        optimizer.keep_base_lr()


def prune_sharded(out_dir):
    """Delete the ckpt-<iter>.dcp folders that no checkpoint file names any more (none while one
    of those files cannot be read)."""
    named = set()
    for path in [os.path.join(out_dir, 'ckpt.pt'), *snapshots(out_dir), os.path.join(out_dir, 'best.pt')]:
        if os.path.exists(path):
            try:
                named.add(load(path)['sharded'])
            except CheckpointError:
                return
    for folder in glob.glob(os.path.join(out_dir, 'ckpt-[0-9]*.dcp*')):
        if os.path.basename(folder) not in named:  # with the .tmp of a save that was cut short
            shutil.rmtree(folder)
