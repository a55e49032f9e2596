"""Batches of (input, target) token windows drawn from a memory-mapped uint16 token file."""

import numpy as np
import torch


class TokenWindows:
    """Random windows of block_size + 1 tokens; x is the first block_size, y the last.

    The file stays a memory map; each batch reads B * (T + 1) tokens. Draws come from the
    object's own generator, so a process's stream depends only on its seed and is saved and
    restored with state_dict() / load_state_dict().
    """

    def __init__(self, path, block_size, batch_size, seed, device='cpu'):
        self.tokens = np.memmap(path, dtype=np.uint16, mode='r')
        if len(self.tokens) <= block_size:
            raise ValueError(f"{path} holds {len(self.tokens)} tokens, too few for block_size={block_size}; "
                             f"lower block_size or use more text")
        self.path, self.block_size, self.batch_size, self.seed = path, block_size, batch_size, seed
        self.device = torch.device(device)
        self.offsets = np.arange(block_size + 1)
        self.generator = torch.Generator().manual_seed(seed)

    def next(self):
        starts = torch.randint(len(self.tokens) - self.block_size, (self.batch_size,), generator=self.generator)
        w = torch.from_numpy(self.tokens[starts.numpy()[:, None] + self.offsets].astype(np.int64))  # (B, T+1)
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
