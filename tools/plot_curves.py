"""Validation curves of runs, from their log.jsonl, in one figure (drawn as tools/compare.py draws them).

    python tools/plot_curves.py out-shakespeare-add out-shakespeare-rot --out out-plots/curves.png
    python tools/plot_curves.py docs/logs/h100_shakespeare/*.jsonl --out out-plots/h100_shakespeare.png

Each argument is a run's out_dir or a copy of its log.jsonl; the legend names it by its folder
or file name. A run with no evaluation logged is skipped with a message; where a run evaluated fewer
than 5 times, the figure draws the training loss of the log lines instead.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from orthogpt import errors, logs, plots  # noqa: E402


@errors.entry
def main(argv=None):
    args = plots.run_arguments(argv, __doc__, 'out-plots/curves.png', 'the PNG to write',
                               runs='out_dir of each run, or its log.jsonl')
    groups = {}
    for run in args.runs:
        records = logs.read(run)
        if not logs.evaluations(records):
            print(f"{run}: no evaluation logged, skipped")
            continue
        groups[os.path.basename(os.path.normpath(run)).removesuffix('.jsonl')] = [records]
    os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
    plots.curves(groups, args.out)


if __name__ == '__main__':
    main()
