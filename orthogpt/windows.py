"""Token files: a prepared dataset found in its folder, checked, and read as batches of random
(input, target) windows."""

import glob
import os

import numpy as np
import torch

from orthogpt import shards
from orthogpt.errors import UserError


def find(folder):
    """(is_shards, {'train': [paths], 'val': [paths]}) for the dataset in folder, or None.
    A character dataset has train.bin and val.bin (raw uint16, described by meta.json); a
    tokenized corpus has train_NNNNNN.bin and val_NNNNNN.bin shards (orthogpt/shards.py)."""
    raw = {split: [os.path.join(folder, f'{split}.bin')] for split in ('train', 'val')}
    if all(os.path.exists(p[0]) for p in raw.values()):
        return False, raw
    found = {split: sorted(glob.glob(os.path.join(folder, f'{split}_[0-9][0-9][0-9][0-9][0-9][0-9].bin')))
             for split in ('train', 'val')}
    return (True, found) if all(found.values()) else None


class TokenWindows:
    """Random windows of block_size + 1 tokens; x is the first block_size, y the last.

    `arrays` are token arrays (memory maps stay memory maps; a batch reads B * (T + 1) tokens).
    Window starts are uniform over all windows of all arrays. Every step draws batch_size *
    world starts from a generator that all `world` processes seed alike, and process `rank`
    takes its own slice; with world > 1, a start already drawn in that step is drawn again, so
    no two processes train on the same window in a step. A process's stream depends only on the
    seed (one process draws exactly as torch.randint(n - T, (B,)) would), and is saved and
    restored with state_dict() / load_state_dict().
    """

    def __init__(self, arrays, block_size, batch_size, seed, device='cpu', rank=0, world=1):
        self.arrays = list(arrays)
        windows = [max(len(a) - block_size, 0) for a in self.arrays]
        self.first = np.cumsum([0] + windows)  # global index of each array's first window
        if self.first[-1] < batch_size * world:
            raise UserError(f"{sum(len(a) for a in self.arrays)} tokens are too few for {batch_size * world} "
                             f"windows of block_size={block_size}; lower block_size or use more text")
        self.block_size, self.batch_size, self.seed, self.rank, self.world = block_size, batch_size, seed, rank, world
        self.device = torch.device(device)
        self.generator = torch.Generator().manual_seed(seed)

    def starts(self):
        total = int(self.first[-1])
        starts = torch.randint(total, (self.batch_size * self.world,), generator=self.generator).tolist()
        if self.world > 1:
            seen = set()
            for i, s in enumerate(starts):
                while s in seen:
                    s = int(torch.randint(total, (1,), generator=self.generator))
                seen.add(s)
                starts[i] = s
        return starts[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]

    def next(self):
        rows = []
        for s in self.starts():
            a = int(np.searchsorted(self.first, s, side='right')) - 1
            offset = s - int(self.first[a])
            rows.append(self.arrays[a][offset:offset + self.block_size + 1])
        w = torch.from_numpy(np.stack(rows).astype(np.int64))  # (B, T+1)
        x, y = w[:, :-1], w[:, 1:]
        if self.device.type == 'cuda':
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def reset(self):
        self.generator.manual_seed(self.seed)

    def state_dict(self):
        return {'generator': self.generator.get_state()}

    def load_state_dict(self, state):
        self.generator.set_state(state['generator'])


def open_tokens(path, is_shard):
    """A token file as a read-only memory map (a shard's header is checked)."""
    return shards.read(path) if is_shard else np.memmap(path, dtype=np.uint16, mode='r')


def check_tokens(path, meta, count_key, prepare_cmd):
    """Refuse a truncated or foreign raw token file before training on it."""
    size = os.path.getsize(path)
    if size % 2:
        raise UserError(f"{path} has an odd number of bytes ({size}): truncated, or not a uint16 token file; "
                        f"recreate it: {prepare_cmd}")
    if meta is None:
        return
    if count_key in meta and size // 2 != meta[count_key]:
        raise UserError(f"{path} holds {size // 2:,} tokens but meta.json records {meta[count_key]:,}: truncated "
                        f"or from another preparation; recreate it: {prepare_cmd}")
    top = int(np.memmap(path, dtype=np.uint16, mode='r').max()) if size else 0
    if top >= meta['vocab_size']:
        raise UserError(f"{path} holds token id {top} but the vocabulary has {meta['vocab_size']} symbols: not a "
                        f"file of this dataset; recreate it: {prepare_cmd}")
