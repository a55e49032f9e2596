"""The one progress bar: tqdm on stderr, shown only once the work has taken DELAY seconds."""

import sys

from tqdm import tqdm

DELAY = 2.0  # seconds before a bar shows: quick work prints nothing
# Where the total is known, the time left is named: "[01:44 elapsed, ETA 06:04, 26.05s/it]"
# rather than tqdm's "[01:44<06:04, 26.05s/it]". An unknown total keeps tqdm's count and rate.
FORMAT = '{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed} elapsed, ETA {remaining}, {rate_fmt}{postfix}]'


def bar(iterable=None, desc=None, total=None, show=True, **kwargs):
    """iterable with a progress bar and an ETA, redrawn every second on a terminal and every 30 s
    in a log file; show=False (another process's share of the work) draws none."""
    if total is None and hasattr(iterable, '__len__'):
        total = len(iterable)
    if total is not None:
        kwargs.setdefault('bar_format', FORMAT)
    return tqdm(iterable, desc=desc, total=total, disable=not show, delay=DELAY, leave=False,
                mininterval=1 if sys.stderr.isatty() else 30, dynamic_ncols=True, **kwargs)
