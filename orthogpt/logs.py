"""A run's logs: out_dir/log.jsonl (one JSON record per line: training lines, evaluations, events),
out_dir/dynamics.jsonl (--dynamics), and their mirror on Weights & Biases; and reading them back."""

import json
import os
from dataclasses import asdict


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
            self.files[name].write(json.dumps(record) + '\n')
            self.files[name].flush()
            if self.wandb is not None:
                self.wandb.log(flatten(record), step=record['iter'])

    def close(self):
        for f in self.files.values():
            f.close()
        if self.wandb is not None:
            self.wandb.finish()


def reopen(path, start_iter):
    """path for appending, holding only the records up to start_iter."""
    kept = []
    if start_iter and os.path.exists(path):
        with open(path) as f:
            kept = [line for line in f if json.loads(line)['iter'] <= start_iter]
    f = open(path, 'w')
    f.writelines(kept)
    return f


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
    """The records of a run's log (given its out_dir, or the .jsonl file itself); [] if unreadable."""
    path = out_dir_or_log if out_dir_or_log.endswith('.jsonl') else os.path.join(out_dir_or_log, f'{name}.jsonl')
    try:
        with open(path) as f:
            return [json.loads(line) for line in f]
    except (OSError, json.JSONDecodeError):
        return []


def evaluations(records):
    """(iteration, val loss, top-1 or None) of each evaluation record."""
    return [(r['iter'], r['val_loss'], r.get('top1')) for r in records if 'val_loss' in r]
