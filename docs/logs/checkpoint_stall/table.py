"""The table of docs/performance.md's "A checkpoint's stall" from the logs beside this file: each
parallel mode's seconds in each save (the log's save_s: its evaluation records', or, in these logs,
written before that, records of their own) and its step time, with the
checkpoint written in the loop and with async_save.

    python docs/logs/checkpoint_stall/table.py [FOLDER]
"""

import json
import os
import statistics
import sys


def table(folder):
    rows = ['| parallel | save | saves | seconds in a save (each) | median save | median step |',
            '|---|---|---|---|---|---|']
    for name in ('ddp', 'fsdp', 'ddp-async', 'fsdp-async'):
        path = os.path.join(folder, f'{name}.jsonl')
        if not os.path.exists(path):
            continue
        with open(path) as f:
            records = [json.loads(line) for line in f]
        saves = [r['save_s'] for r in records if 'save_s' in r]
        steps = [r['ms_per_iter'] / 1000 for r in records if 'ms_per_iter' in r]
        parallel, _, background = name.partition('-')
        rows.append(f"| {parallel} | {'async_save' if background else 'in the loop'} | {len(saves)} | {', '.join(f'{s:.1f}' for s in saves)} | "
                    f"{statistics.median(saves):.1f} s | {statistics.median(steps):.1f} s |")
    return '\n'.join(rows)


if __name__ == '__main__':
    print(table(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))))
