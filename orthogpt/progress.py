"""The one progress bar: tqdm on stderr, shown only once the work has taken DELAY seconds."""

import sys

from tqdm import tqdm

DELAY = 2.0  # seconds before a bar shows: quick work prints nothing


def bar(iterable=None, desc=None, total=None, show=True, **kwargs):
    """iterable with a progress bar and an ETA, redrawn every second on a terminal and every 30 s
    in a log file; show=False (another process's share of the work) draws none."""
    return tqdm(iterable, desc=desc, total=total, disable=not show, delay=DELAY, leave=False,
                mininterval=1 if sys.stderr.isatty() else 30, dynamic_ncols=True, **kwargs)
