"""What lets a long run stop safely and resume exactly: RNG state, signals, non-finite steps."""

import random
import signal
import threading

import numpy as np
import torch
import torch.distributed as dist


def rng_state(device_type):
    """This process's torch, CUDA, numpy and Python RNG states as checkpoint-safe data."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {'torch': torch.get_rng_state(), 'python': random.getstate(),
             'numpy': [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached]}
    if device_type == 'cuda':
        state['cuda'] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state):
    torch.set_rng_state(state['torch'])
    random.setstate(state['python'])
    name, keys, pos, has_gauss, cached = state['numpy']
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state['cuda'])


def seed_all(seed):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


class StepScaler(torch.amp.GradScaler):
    """Loss scaling for float16, and for every dtype a guard: a step whose gradients hold inf or
    nan is skipped (on the device when AdamW is fused, as on CUDA and CPU: no host sync).
    Outside float16 the scale stays 1, so the arithmetic is exactly that of unscaled training."""

    def __init__(self, device_type, dtype):
        self.dynamic = dtype == 'float16'
        super().__init__(device_type, init_scale=2.0 ** 16 if self.dynamic else 1.0)

    def update(self, new_scale=None):
        super().update(new_scale if self.dynamic else 1.0)

    def inverse(self):
        """1 / the current scale, as a device tensor (no host sync)."""
        return self._scale.reciprocal()


class NonFinite:
    """Steps whose loss or gradients were not finite, tallied on the device; check() reads the
    tally (one host sync), which the training loop does once per log interval."""

    def __init__(self, names, device):
        self.names, self.device = names, device
        self.bad_params = torch.zeros(len(names), dtype=torch.bool, device=device)
        self.stats = torch.tensor([0, -1, 0], device=device)  # bad steps, first bad iteration, streak

    def record(self, iter_num, loss, grad_norms):
        bad_params = ~torch.isfinite(grad_norms)
        bad = (bad_params.any() | ~torch.isfinite(loss)).long()
        self.bad_params |= bad_params
        count, first, streak = self.stats
        self.stats = torch.stack([count + bad, torch.where((first < 0) & (bad > 0), iter_num, first),
                                  (streak + 1) * bad])

    def check(self):
        """(bad steps, first bad iteration, current streak, parameter names) since the last check."""
        count, first, streak = self.stats.tolist()
        names = [n for n, bad in zip(self.names, self.bad_params.tolist()) if bad] if count else []
        self.stats = torch.tensor([0, -1, streak], device=self.device)
        self.bad_params.zero_()
        return count, first, streak, names


class Interrupted(Exception):
    """Raised between the batches of an evaluation that a signal cut short; args[0] is the signal."""


class Interrupt:
    """SIGINT and SIGTERM ask training to stop at the next step boundary, or after the current
    batch of an evaluation; a second one acts as usual (Ctrl-C twice still kills). Under DDP the
    processes agree through one all_reduce."""

    def __init__(self):
        self.signum, self.handlers = 0, {}
        if threading.current_thread() is threading.main_thread():
            self.handlers = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def handle(self, signum, frame):
        self.signum = signum
        self.restore()

    def restore(self):
        for s, handler in self.handlers.items():
            signal.signal(s, handler)
        self.handlers = {}

    def agreed(self, ddp, device):
        """The signal to act on now: under DDP the largest any process has received."""
        if not ddp:
            return self.signum
        flag = torch.tensor(self.signum, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def check(self, ddp, device):
        """Raise Interrupted if the processes agree that a signal came."""
        signum = self.agreed(ddp, device)
        if signum:
            raise Interrupted(signum)
