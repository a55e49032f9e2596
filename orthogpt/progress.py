"""Progress: the one progress bar (tqdm on stderr, shown only once the work has taken DELAY seconds),
and the recent speed of work watched from outside (Speed), for the time left of the tools that run
others (tools/compare.py, tools/miniseries.py)."""

import sys
import time

from tqdm import tqdm

DELAY = 2.0  # seconds before a bar shows: quick work prints nothing
# Where the total is known, the time left is named: "[01:44 elapsed, ETA 06:04, 26.05s/it]"
# rather than tqdm's "[01:44<06:04, 26.05s/it]". An unknown total keeps tqdm's count and rate.
FORMAT = '{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed} elapsed, ETA {remaining}, {rate_fmt}{postfix}]'
EVERY = 30  # seconds between the progress lines of a tool that runs others
WINDOW = 120  # seconds of recent work whose speed gives the time left


def bar(iterable=None, desc=None, total=None, show=True, **kwargs):
    """iterable with a progress bar and an ETA, redrawn every second on a terminal and every 30 s
    in a log file; show=False (another process's share of the work) draws none."""
    if total is None and hasattr(iterable, '__len__'):
        total = len(iterable)
    if total is not None:
        kwargs.setdefault('bar_format', FORMAT)
    return tqdm(iterable, desc=desc, total=total, disable=not show, delay=DELAY, leave=False,
                mininterval=1 if sys.stderr.isatty() else 30, dynamic_ncols=True, **kwargs)


class Speed:
    """The speed of work over its last `window` seconds: see(done) records the work done so far
    (iterations, FLOPs), left(remaining) the seconds the rest takes at that speed (None before any
    work is seen). A machine that slows down or speeds up moves the estimate within a window."""

    def __init__(self, window=WINDOW):
        self.window, self.seen = window, []

    def see(self, done, now=None):
        now = time.monotonic() if now is None else now
        self.seen.append((now, done))
        while len(self.seen) > 2 and self.seen[1][0] <= now - self.window:  # the oldest kept opens the window
            self.seen.pop(0)

    def left(self, remaining):
        if len(self.seen) < 2:
            return None
        (t0, d0), (t1, d1) = self.seen[0], self.seen[-1]
        return remaining * (t1 - t0) / (d1 - d0) if d1 > d0 and t1 > t0 else None
