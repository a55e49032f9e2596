"""A run's logs: out_dir/log.jsonl (one JSON record per line: training lines, evaluations, events),
out_dir/dynamics.jsonl (--dynamics), and their mirror on Weights & Biases; and reading them back.

A line that does not parse (cut short by a crash or a full disk, or glued to another) is dropped
with a warning naming the file and the line, by a resumed run as by a reader: a damaged log never
stops a resume, nor hides the rest of a run's records.
"""

import json
import os
from contextlib import suppress
from dataclasses import asdict

from orthogpt.files import write_error, write_text


class RunLog:
    """The logs of a run, written by rank 0 alone (every other process holds a RunLog that writes
    nothing). A resumed run keeps the records up to the iteration it resumes from: a run that died
    after its last checkpoint logged steps the resumed one logs again."""

    def __init__(self, cfg, master, start_iter):
        self.files, self.wandb = {}, None
        if not master:
            return
        os.makedirs(cfg.out_dir, exist_ok=True)
        names = ['log'] + (['dynamics'] if cfg.dynamics else [])
        self.files = {name: reopen(os.path.join(cfg.out_dir, f'{name}.jsonl'), start_iter) for name in names}
        if cfg.wandb_log:
            import wandb
            self.wandb = wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name, config=asdict(cfg),
                                    dir=cfg.out_dir, mode=wandb_mode())

    def write(self, record, name='log'):
        if name in self.files:
            f = self.files[name]
            try:
                f.write(json.dumps(record) + '\n')
                f.flush()
            except OSError as e:
                raise write_error(f.name, e, "the records written before are kept") from None
            if self.wandb is not None:
                self.wandb.log(flatten(record), step=record['iter'])

    def close(self):
        for f in self.files.values():
            with suppress(OSError):  # the rest of a write that failed, which raised already
                f.close()
        if self.wandb is not None:
            self.wandb.finish()


def reopen(path, start_iter):
    """path for appending, holding only the records up to start_iter (rewritten atomically)."""
    kept = [line for line, record in parsed(path) if record['iter'] <= start_iter] if start_iter else []
    write_text(path, ''.join(line.rstrip('\n') + '\n' for line in kept))
    return open(path, 'a')


WARNED = set()  # (file, number, line) of each damaged line reported: compare.py reads a log again and again


def parsed(path):
    """(line, record) of each line of a .jsonl file that holds a record (a JSON object with an
    'iter'); a line that does not is dropped with a warning. [] if the file is missing."""
    try:
        with open(path, errors='replace') as f:  # a line cut inside a character still reads
            lines = f.readlines()
    except FileNotFoundError:
        return []
    found = []
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and isinstance(record.get('iter'), int):
            found.append((line, record))
        elif (path, n, line) not in WARNED:
            WARNED.add((path, n, line))
            print(f"warning: {path} line {n} is not a whole record, dropped: {line.strip()[:80]!r}")
    return found


def wandb_mode():
    """WANDB_MODE if set; else 'online' when a W&B key is configured (env or `wandb login`),
    else 'offline'."""
    if os.environ.get('WANDB_MODE'):
        return os.environ['WANDB_MODE']
    if os.environ.get('WANDB_API_KEY'):
        return 'online'
    netrc = os.path.expanduser('~/.netrc')
    if os.path.exists(netrc):
        with open(netrc) as f:
            if 'api.wandb.ai' in f.read():
                return 'online'
    return 'offline'


def flatten(record, prefix=''):
    """Numbers of a nested record as {'a/b/0': v} for wandb."""
    out = {}
    for k, v in record.items():
        if k == 'iter' and not prefix:
            continue
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}/"))
        elif isinstance(v, list):
            out.update({f"{prefix}{k}/{i}": e for i, e in enumerate(v) if isinstance(e, (int, float))})
        elif isinstance(v, (int, float)):
            out[prefix + k] = v
    return out


def read(out_dir_or_log, name='log'):
    """The records of a run's log (given its out_dir, or the .jsonl file itself); [] if it has none."""
    path = out_dir_or_log if out_dir_or_log.endswith('.jsonl') else os.path.join(out_dir_or_log, f'{name}.jsonl')
    try:
        return [record for _, record in parsed(path)]
    except OSError:
        return []


def evaluations(records):
    """(iteration, val loss, top-1 or None) of each evaluation record."""
    return [(r['iter'], r['val_loss'], r.get('top1')) for r in records if 'val_loss' in r]


def training(records):
    """(iteration, training loss, None) of each training line's record, as evaluations() gives them."""
    return [(r['iter'], r['loss'], None) for r in records if 'loss' in r]
