"""How far a fixed number of Lanczos steps, and the stop that docs/rules.md ("Diagnostics across depth") describes,
read the stream map's largest singular value below 30 steps, on trained checkpoints, and what each costs:

    python docs/logs/lanczos_stop/measure.py OUT_DIR [OUT_DIR ...] [--data_dir=...]

For each run: its best.pt, the first sequence of its first validation batch (a dynamics record measures a training
batch's), the stream gains of every sublayer with 5 and 8 steps, with the stop (orthogpt.diagnostics' defaults) and with 30 steps;
per setting the largest shortfall from 30 steps over the sublayers (map_max) and the seconds it took, after one
untimed pass.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..'))
import configure  # noqa: E402
from orthogpt import checkpoint, diagnostics  # noqa: E402
from orthogpt.tasks import make_task  # noqa: E402

SETTINGS = {'5 steps': (5, 0.0), '8 steps': (8, 0.0),
            'the stop': (diagnostics.LANCZOS_STEPS, diagnostics.LANCZOS_TOL), '30 steps': (30, 0.0)}


def measure(out_dir, data_dir):
    model, ckpt, cfg = checkpoint.load_language_model(out_dir)
    if data_dir:
        cfg = configure.from_dict({**ckpt['config'], 'data_dir': data_dir})
    idx = make_task(cfg, 'cpu').eval_inputs()[:diagnostics.SEQUENCES]
    diagnostics.stream_gains(model, idx, 2, 0.0)  # warm up: the first pass pays one-time costs
    found = {}
    for name, (iters, tol) in SETTINGS.items():
        t0 = time.perf_counter()
        found[name] = (diagnostics.stream_gains(model, idx, iters, tol)[:, 0], time.perf_counter() - t0)
    ref = found['30 steps'][0]
    cells = [f"{(1 - gains / ref).max().item():.2%} low, {seconds:.1f} s" for gains, seconds in found.values()]
    return f"| {os.path.basename(os.path.normpath(out_dir))} ({cfg.residual}) | " + ' | '.join(cells) + ' |'


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('runs', nargs='+')
    p.add_argument('--data_dir', default=None)
    args = p.parse_args()
    print('| run | ' + ' | '.join(f"{s}: largest shortfall, time" for s in SETTINGS) + ' |\n|---|'
          + '---|' * len(SETTINGS))
    for run in args.runs:
        print(measure(run, args.data_dir), flush=True)
