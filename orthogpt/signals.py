"""Ctrl-C and SIGTERM as a request: stop at the next step boundary, or after the current batch of
an evaluation, so that the run can save first."""

import signal
import threading

import torch
import torch.distributed as dist


class Interrupted(Exception):
    """A signal stopped the run: between two steps, or between the batches of an evaluation."""

    def __init__(self, signum, evaluating=True):
        super().__init__(signum, evaluating)
        self.signum, self.evaluating = signum, evaluating


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
