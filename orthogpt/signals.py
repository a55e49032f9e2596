"""Ctrl-C and SIGTERM as a request: stop at the next step boundary, or after the current batch of
an evaluation, so that the run can save first; and SIGTERM when a launcher dies, for the same end."""

import ctypes
import signal
import sys
import threading

import torch
import torch.distributed as dist

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# looked up now, not in a child between fork and exec (orthogpt/launcher.py's preexec_fn), where it could deadlock
PRCTL = ctypes.CDLL(None).prctl if sys.platform == 'linux' else None


class Interrupted(Exception):
    """A signal stopped the run: between two steps, or between the batches of an evaluation."""

    def __init__(self, signum, evaluating=True):
        super().__init__(signum, evaluating)
        self.signum, self.evaluating = signum, evaluating


class Interrupt:
    """SIGINT and SIGTERM ask training to stop at the next step boundary, or after the current
    batch of an evaluation. After a SIGINT both act as usual again (Ctrl-C twice still kills); a
    SIGTERM may come again and asks the same: the parent-death signal (stop_with_parent) comes once
    for each thread of the dying launcher, as the kernel hands the worker from thread to thread.
    Under DDP the processes agree through one all_reduce."""

    def __init__(self):
        self.signum, self.handlers = 0, {}
        if threading.current_thread() is threading.main_thread():
            self.handlers = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def handle(self, signum, frame):
        self.signum = self.signum or signum
        if signum == signal.SIGINT:
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


def stop_with_parent():
    """Have Linux send this process SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG), which
    Interrupt takes as a request to save and stop: a torchrun worker runs in a session of its own
    and would otherwise train on, writing its out_dir, after its launcher is SIGKILLed. Nothing
    where there is no prctl (macOS)."""
    if PRCTL is not None:
        PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
