"""Checkpoint files: written atomically, verified on load, read with weights_only=True.

A checkpoint is a dict saved by torch.save; its metadata ('config', 'meta') is JSON text, and
'format' the version of its layout (FORMAT), which load() checks: a checkpoint of another layout
is refused with the version it has. save() adds 'checksum', a SHA-256 over every tensor and
string in it (torch.load checks no checksum of its own: a flipped byte in tensor data loads
silently), and load() refuses a file whose checksum does not match, or that does not unpickle
(truncated, not a checkpoint).

In an out_dir: ckpt.pt is the latest, ckpt-<iter>.pt the last keep_last_n saves (hard links, so
the newest costs no space) and best.pt the one with the best val loss. load_latest() takes the
newest of them that verifies. A run with parallel='fsdp' keeps its model and optimizer state in
ckpt-<iter>.dcp folders instead (orthogpt/sharded.py); the checkpoint file names its folder
('sharded') and records the size and SHA-256 of each of the folder's files ('shards'), and load()
refuses a checkpoint whose folder lost a file or holds one that changed (truncated, say), as it
refuses a damaged file.
"""

import glob
import hashlib
import json
import os

import torch

import configure
from model import GPT
from orthogpt.errors import UserError
from orthogpt.files import fsync_dir, link_atomic, write_atomic

FORMAT = 1  # the layout of the checkpoint dict; raise it when the layout changes


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
    """obj, with its format and checksum (and the files of the folder it names, if sharded), to
    `path` atomically (files.write_atomic)."""
    obj = dict(obj, format=FORMAT)
    if obj['sharded']:
        obj['shards'] = shards(os.path.join(os.path.dirname(path), obj['sharded']))
    obj['checksum'] = checksum(obj)
    write_atomic(path, lambda f: torch.save(obj, f))


def shards(folder):
    """{name: [size, SHA-256]} of each file of a ckpt-<iter>.dcp folder."""
    return {name: [os.path.getsize(os.path.join(folder, name)), digest(os.path.join(folder, name))]
            for name in sorted(os.listdir(folder))}


def digest(path):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 24), b''):
            h.update(block)
    return h.hexdigest()


def folder_damage(folder, recorded, hashes):
    """Why the files of a ckpt-<iter>.dcp folder are not those recorded ({name: [size, SHA-256]},
    shards(); with hashes False the sizes alone are compared; [] checks that the file exists), or None."""
    for name, want in recorded.items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return f"whose file {name} is missing"
        if not want:
            continue
        size, sha = want
        if os.path.getsize(path) != size:
            return f"whose file {name} holds {os.path.getsize(path):,} bytes, not the {size:,} written (truncated?)"
        if hashes and digest(path) != sha:
            return f"whose file {name} fails its checksum: its contents changed after it was written"
    return None


def snapshot(out_dir, iter_num, keep_last_n):
    """Keep ckpt.pt as ckpt-<iter>.pt too, and only the newest keep_last_n of those."""
    if keep_last_n < 1:
        return
    link_atomic(os.path.join(out_dir, 'ckpt.pt'), os.path.join(out_dir, f'ckpt-{iter_num:07d}.pt'))
    for old in snapshots(out_dir)[keep_last_n:]:
        os.remove(old)
    fsync_dir(out_dir)


def keep_best(out_dir):
    """best.pt: the same file as ckpt.pt, just saved."""
    link_atomic(os.path.join(out_dir, 'ckpt.pt'), os.path.join(out_dir, 'best.pt'))


def snapshots(out_dir):
    """ckpt-<iter>.pt files, newest first."""
    return sorted(glob.glob(os.path.join(out_dir, 'ckpt-[0-9]*.pt')), reverse=True)


def candidates(out_dir):
    """Every checkpoint file of out_dir, newest first, best.pt last."""
    paths = [os.path.join(out_dir, 'ckpt.pt')] + snapshots(out_dir) + [os.path.join(out_dir, 'best.pt')]
    return [p for p in paths if os.path.exists(p)]


def load(path, map_location='cpu', hashes=True):
    """A verified checkpoint dict with 'config' (and 'meta', if saved) decoded from JSON; with
    hashes False the files of a sharded checkpoint's folder are checked by size alone."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}; train one first (python train.py CONFIG) "
                        f"or point --out_dir at the folder holding ckpt.pt")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
        stored = ckpt.pop('checksum')
    except Exception as e:
        raise UserError(f"{path} is not a readable checkpoint (truncated, corrupt or not ours: "
                        f"{type(e).__name__}: {str(e)[:200]})") from None
    if checksum(ckpt) != stored:
        raise UserError(f"{path} fails its checksum: its contents changed after it was written")
    if ckpt.get('format') != FORMAT:
        raise UserError(f"{path} is a checkpoint of format {ckpt.get('format')!r}, written by another version of "
                        f"OrthoGPT; this version reads format {FORMAT}: use the version that wrote it")
    folder = ckpt['sharded'] and os.path.join(os.path.dirname(path), ckpt['sharded'])
    if folder:
        if not os.path.isdir(folder):
            raise UserError(f"{path} names {folder}, which is missing")
        damage = folder_damage(folder, ckpt.get('shards', {'.metadata': []}), hashes)  # older: no sizes recorded
        if damage:
            raise UserError(f"{path} names {folder}, {damage}")
    ckpt['config'] = json.loads(ckpt['config'])
    if ckpt['meta'] is not None:
        ckpt['meta'] = json.loads(ckpt['meta'])
    return ckpt


def named_folders(out_dir):
    """The ckpt-<iter>.dcp folders that the checkpoint files of out_dir name, or None while one of
    those files cannot be read (then none may be deleted)."""
    try:
        return {load(path, hashes=False)['sharded'] for path in candidates(out_dir)}
    except UserError:
        return None


def load_latest(out_dir, map_location='cpu'):
    """(checkpoint, path, refused): the newest of ckpt.pt, ckpt-<iter>.pt, best.pt that verifies;
    refused lists (path, reason) for the newer ones that did not."""
    refused = []
    for path in candidates(out_dir):
        try:
            return load(path, map_location), path, refused
        except UserError as e:
            refused.append((path, str(e)))
    if not refused:
        raise UserError(f"no checkpoint in {out_dir}; train one first (python train.py CONFIG) "
                        f"or point --out_dir at the folder holding ckpt.pt")
    raise UserError("no usable checkpoint in " + out_dir + ":\n  " + "\n  ".join(r for _, r in refused))


def load_language_model(out_dir, name=None, map_location='cpu'):
    """(GPT in eval mode, its checkpoint, its Config) from out_dir/name (default: best.pt, else
    ckpt.pt); an image classifier's checkpoint is refused."""
    name = name or ('best.pt' if os.path.exists(os.path.join(out_dir, 'best.pt')) else 'ckpt.pt')
    path = os.path.join(out_dir, name)
    ckpt = load(path, map_location)
    try:
        cfg = configure.from_dict(ckpt['config'])
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
    if cfg.model != 'gpt':
        raise UserError(f"{path} is an image classifier ({cfg.dataset}), not a language model")
    model = GPT(configure.model_config(cfg))
    load_weights(model, ckpt, path)
    return model.eval(), ckpt, cfg


def load_weights(model, ckpt, path, optimizer=None):
    """The weights of the checkpoint `ckpt`, read from `path`, into model (and, unless None, its
    optimizer's state into optimizer): from the file itself, or from the ckpt-<iter>.dcp folder it
    names."""
    if ckpt['sharded']:
        from orthogpt import sharded  # torch.distributed.checkpoint: loaded only for such checkpoints
        sharded.load(model, optimizer, os.path.join(os.path.dirname(path), ckpt['sharded']))
        return
    model.load_state_dict(ckpt['model'])
    if optimizer is not None:
        optimizer.load_state_dict(ckpt['optimizer'])
