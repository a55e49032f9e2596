"""Checkpoint files: written atomically, verified on load, read with weights_only=True.

A checkpoint is a dict saved by torch.save; its metadata ('config', 'meta') is JSON text, and
'format' the version of its layout (FORMAT), which load() checks: a checkpoint of another layout
is refused with the version it has. save() adds 'checksum', a SHA-256 over every tensor and
string in it (torch.load checks no checksum of its own: a flipped byte in tensor data loads
silently), and load() refuses a file whose checksum does not match, or that does not unpickle
(truncated, not a checkpoint).

In an out_dir: ckpt.pt is the latest, ckpt-<iter>.pt the last keep_last_n saves (hard links, so
the newest costs no space) and best.pt the one with the best val loss. load_latest() takes the
newest of them that verifies, as resume wants; load_chosen() best.pt first, as the readers
(sample.py, the tools) want, falling back to the newest that verifies where it is damaged. Since
the names are hard links, one damaged file damages every name it has: retain(), after each save,
moves the files that do not verify aside (into damaged/), keeps the newest keep_last_n that do, and
points best.pt at the newest verified checkpoint saved as the best. A run with parallel='fsdp'
keeps its model and optimizer state in
ckpt-<iter>.dcp folders instead (orthogpt/sharded.py); the checkpoint file names its folder
('sharded') and records the size and SHA-256 of each of the folder's files ('shards'), and load()
refuses a checkpoint whose folder lost a file or holds one that changed (truncated, say), as it
refuses a damaged file.
"""

import glob
import hashlib
import json
import os
import threading
from dataclasses import dataclass, replace

import torch
import torch.utils._pytree

import configure
from model import GPT
from orthogpt.errors import UserError, one_line
from orthogpt.files import fsync_dir, link_atomic, write_atomic

FORMAT = 1  # the layout of the checkpoint dict; raise it when the layout changes
CHOICE = ("file in out_dir (default: best.pt, else the newest; one that does not verify gives way to the newest "
          "that does)")  # the readers' --ckpt, as load_chosen takes it
DAMAGED = 'damaged'  # the folder of an out_dir that its checkpoint files that do not verify are moved to


class Damaged(UserError):
    """A checkpoint file that does not verify; its message reads 'PATH WHY'."""

    def __init__(self, path, why):
        super().__init__(f"{path} {why}")
        self.path, self.why = str(path), why


@dataclass(frozen=True)
class Seen:
    """What reading a checkpoint file found: why it does not verify (None: it does) and, where it
    does, its iteration, whether it was saved as the best, and the folder it names with its files."""
    why: str | None
    iter_num: int | None = None
    best: bool = False
    sharded: str | None = None
    shards: dict | None = None


# A checkpoint file's identity (device, inode, size, modification time) -> its Seen: a file read or
# written once is not read again while it is unchanged (a truncated or rewritten file changes its size
# or time), so that a save checks the files it keeps without rereading them.
SEEN = {}


def identity(path):
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def seen_in(ckpt):
    return Seen(None, ckpt.get('iter_num'), bool(ckpt.get('best')), ckpt.get('sharded'), ckpt.get('shards'))


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
    SEEN[identity(path)] = seen_in(obj)


def snapshot(obj):
    """obj with each tensor copied to the CPU: what a checkpoint written in the background (Writer)
    reads while training goes on changing the originals."""
    return torch.utils._pytree.tree_map(lambda x: x.detach().to('cpu', copy=True) if torch.is_tensor(x) else x, obj)


class Writer:
    """Where a run's checkpoints are written: in the loop, or (async_save) by a thread of their own
    while training goes on, one at a time. The next save and the run's end wait for the one in
    flight, and a write that failed in the thread raises there."""

    def __init__(self):
        self.thread, self.error = None, None

    def start(self, write, background):
        self.wait()
        if not background:
            write()
            return

        def run():
            try:
                write()
            except BaseException as e:  # raised where the run next waits
                self.error = e
        self.thread = threading.Thread(target=run, name='checkpoint')
        self.thread.start()

    def wait(self):
        """Once the checkpoint in flight is written; its failure, raised."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        error, self.error = self.error, None
        if error is not None:
            raise error


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


def retain(out_dir, iter_num, keep_last_n, best):
    """After ckpt.pt is saved at iter_num: keep it as ckpt-<iter>.pt too (keep_last_n > 0) and as
    best.pt (best); move every checkpoint file that does not verify into damaged/, saying so; keep the
    newest keep_last_n ckpt-<iter>.pt of those that do; and where best.pt was damaged, point it at the
    newest verified checkpoint saved as the best (none: readers take the newest checkpoint)."""
    ckpt, best_pt = os.path.join(out_dir, 'ckpt.pt'), os.path.join(out_dir, 'best.pt')
    if keep_last_n >= 1:
        link_atomic(ckpt, os.path.join(out_dir, f'ckpt-{iter_num:07d}.pt'))
    if best:
        link_atomic(ckpt, best_pt)
    seen = {path: look(path) for path in candidates(out_dir)}
    damaged = [path for path, s in seen.items() if s.why]
    for names, why in by_file(damaged, {path: seen[path].why for path in damaged}):
        print(f"warning: {report([(names, why)])}; moved into {move_aside(out_dir, names)}/, where nothing reads it")
    if keep_last_n >= 1:
        for old in snapshots(out_dir)[keep_last_n:]:
            os.remove(old)
    if best_pt in damaged:
        kept = [(seen[p].iter_num, p) for p in candidates(out_dir) if seen[p].best]
        if kept:
            link_atomic(max(kept)[1], best_pt)
        print(f"best.pt is now {os.path.basename(max(kept)[1])} (iteration {max(kept)[0]}), the newest checkpoint "
              f"saved as the best that verifies" if kept else
              "no checkpoint that verifies was saved as the best: best.pt returns at the next best evaluation, and "
              "sample.py and the tools take the newest checkpoint meanwhile")
    fsync_dir(out_dir)


def move_aside(out_dir, names):
    """Move the files `names` into out_dir/damaged/ (a name taken there gets a number); returns the folder."""
    folder = os.path.join(out_dir, DAMAGED)
    os.makedirs(folder, exist_ok=True)
    for path in names:
        target, n = os.path.join(folder, os.path.basename(path)), 1
        while os.path.exists(target):
            target, n = os.path.join(folder, f"{os.path.basename(path)}.{n}"), n + 1
        os.replace(path, target)
    return folder


def by_file(paths, why):
    """[(names, why)]: the paths grouped by the file they name (hard links), in order; why: {path: reason}."""
    groups = {}
    for path in paths:
        st = os.stat(path)
        groups.setdefault((st.st_dev, st.st_ino), []).append(path)
    return [(names, why[names[0]]) for names in groups.values()]


def report(groups):
    """'PATH WHY (the same file as B and C); ...': what does not verify, on one line."""
    return '; '.join(f"{names[0]} {why}" + (f" ({same_file(names)})" if names[1:] else '')
                     for names, why in groups)


def same_file(names):
    """'the same file as B and C': the other names of one file (hard links)."""
    return f"the same file as {' and '.join(os.path.basename(p) for p in names[1:])}"


def snapshots(out_dir):
    """ckpt-<iter>.pt files, newest first."""
    return sorted(glob.glob(os.path.join(out_dir, 'ckpt-[0-9]*.pt')), reverse=True)


def candidates(out_dir):
    """Every checkpoint file of out_dir, newest first, best.pt last."""
    paths = [os.path.join(out_dir, 'ckpt.pt')] + snapshots(out_dir) + [os.path.join(out_dir, 'best.pt')]
    return [p for p in paths if os.path.exists(p)]


def load(path, map_location='cpu', hashes=True):
    """A verified checkpoint dict with 'config' (and 'meta', if saved) decoded from JSON; with
    hashes False the files of a sharded checkpoint's folder are checked by size alone. Damaged where
    it does not verify."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}; train one first (python train.py CONFIG) "
                        f"or point --out_dir at the folder holding ckpt.pt")
    key, why = identity(path), None
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
        stored = ckpt.pop('checksum')
    except Exception as e:
        why = f"is not a readable checkpoint (truncated, corrupt or not ours: {type(e).__name__}: {one_line(str(e))})"
    else:
        if checksum(ckpt) != stored:
            why = "fails its checksum: its contents changed after it was written"
        elif ckpt.get('format') != FORMAT:
            why = (f"is a checkpoint of format {ckpt.get('format')!r}, written by another version of OrthoGPT; this "
                   f"version reads format {FORMAT}: use the version that wrote it")
    SEEN[key] = Seen(why) if why else seen_in(ckpt)
    why = why or folder_problem(path, SEEN[key], hashes)
    if why:
        raise Damaged(path, why)
    ckpt['config'] = json.loads(ckpt['config'])
    if ckpt['meta'] is not None:
        ckpt['meta'] = json.loads(ckpt['meta'])
    return ckpt


def folder_problem(path, seen, hashes):
    """Why the ckpt-<iter>.dcp folder that the checkpoint at path names (seen: its Seen) is not as
    written, or None (none for a checkpoint that names no folder)."""
    if not seen.sharded:
        return None
    folder = os.path.join(os.path.dirname(path), seen.sharded)
    if not os.path.isdir(folder):
        return f"names {folder}, which is missing"
    damage = folder_damage(folder, seen.shards or {'.metadata': []}, hashes)  # older: no sizes recorded
    return damage and f"names {folder}, {damage}"


def look(path):
    """The Seen of the checkpoint file at path, read only if it changed since it was last read or
    written; its folder's files (if sharded) checked by size."""
    seen = SEEN.get(identity(path))
    if seen is None:
        try:
            load(path, hashes=False)
        except Damaged:
            pass
        seen = SEEN[identity(path)]
    return replace(seen, why=seen.why or folder_problem(path, seen, hashes=False))


def named_folders(out_dir):
    """The ckpt-<iter>.dcp folders that the checkpoint files of out_dir name, or None while one of
    those files does not verify (then none may be deleted)."""
    seen = [look(path) for path in candidates(out_dir)]
    return None if any(s.why for s in seen) else {s.sharded for s in seen}


def first_verified(out_dir, paths, map_location):
    """(checkpoint, path, refused) of the first of paths that verifies; refused: [(names, why)] of
    the files before it that did not, each with all its names among paths (hard links). A UserError
    in one line where none verifies."""
    refused, names = [], {}
    for path in paths:
        st = os.stat(path)
        if (st.st_dev, st.st_ino) in names:  # another name of a file that did not verify
            names[st.st_dev, st.st_ino].append(path)
            continue
        try:
            return load(path, map_location), path, refused
        except Damaged as e:
            names[st.st_dev, st.st_ino] = [path]
            refused.append((names[st.st_dev, st.st_ino], e.why))
    raise UserError(f"no checkpoint in {out_dir} verifies: {report(refused)}; start again in another --out_dir")


def load_latest(out_dir, map_location='cpu'):
    """(checkpoint, path, refused): the newest of ckpt.pt, ckpt-<iter>.pt, best.pt that verifies, as
    resume wants; refused lists ([names], why) of the newer files that did not."""
    paths = candidates(out_dir)
    if not paths:
        raise UserError(f"no checkpoint in {out_dir}; train one first (python train.py CONFIG) "
                        f"or point --out_dir at the folder holding ckpt.pt")
    return first_verified(out_dir, paths, map_location)


def load_chosen(out_dir, name=None, map_location='cpu'):
    """(checkpoint, path) for a reader (sample.py, the tools): out_dir/name, refused where it does not
    verify in one line that names those that do; or by default best.pt, else the newest checkpoint,
    and where that one does not verify the newest that does, with a line saying which and why."""
    if name:
        path = os.path.join(out_dir, name)
        try:
            return load(path, map_location), path
        except UserError as e:
            problem = str(e) if os.path.isfile(path) else f"no checkpoint at {path}"
            raise UserError(f"{problem}; {verified_ones(out_dir)}") from None
    best = os.path.join(out_dir, 'best.pt')
    paths = list(dict.fromkeys([best] * os.path.exists(best) + candidates(out_dir)))  # best.pt first
    if not paths:
        raise UserError(f"no checkpoint in {out_dir}; train one first (python train.py CONFIG) "
                        f"or point --out_dir at the folder holding ckpt.pt")
    ckpt, path, refused = first_verified(out_dir, paths, map_location)
    if refused:
        print(f"warning: {report(refused)}; using {path} (iteration {ckpt['iter_num']}), the newest checkpoint "
              f"that verifies")
    return ckpt, path


def verified_ones(out_dir):
    """Which checkpoint files of out_dir verify, as the end of a refusal."""
    good = {path: s.iter_num for path in candidates(out_dir) for s in [look(path)] if not s.why}
    if not good:
        return f"no checkpoint in {out_dir} verifies" if candidates(out_dir) else f"{out_dir} holds no checkpoint"
    return ("these verify: " + ', '.join(f"{os.path.basename(names[0])} (iteration {it}"
                                         + (f"; {same_file(names)})" if names[1:] else ')')
                                         for names, it in by_file(good, good)) + "; pass one with --ckpt")


def load_language_model(out_dir, name=None, map_location='cpu'):
    """(GPT in eval mode, its checkpoint, its Config) from load_chosen(out_dir, name); an image
    classifier's checkpoint is refused."""
    ckpt, path = load_chosen(out_dir, name, map_location)
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
    differ = sorted(set(model.state_dict()) ^ set(ckpt['model']))
    if differ:  # a model.py that builds other parameters for the same config (a rule changed since the save)
        raise UserError(f"{path} and this model.py disagree on the parameters of its config: "
                        f"{', '.join(differ[:4])}{', ...' if len(differ) > 4 else ''}; the checkpoint was written by "
                        f"another version of model.py, so load it with that version")
    model.load_state_dict(ckpt['model'])
    if optimizer is not None:
        optimizer.load_state_dict(ckpt['optimizer'])
