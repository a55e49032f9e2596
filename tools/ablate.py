"""Causal ablations of a trained model: one mechanism switched off at evaluation, no retraining, and the change in
validation loss it costs.

    python tools/ablate.py --out_dir=out-shakespeare-mhc-cpu                      # every ablation its rule has
    python tools/ablate.py --out_dir=out-shakespeare-ddl-cpu --what=beta_zero --eval_iters=50

The ablations (orthogpt/ablations.py), each for the rules it applies to:
  mixing_identity   hc, mhc: H_res := I, the copies read and written but never mixed
  maps_at_init      hc, mhc: the read and write weights as the rule starts them; the mixing stays learned
  uniform_depth     attnres: the depth queries at 0, every read the uniform mean of its sources
  beta_zero         ddl: the gate beta := 0, every sublayer the identity shortcut
  write_only        ddl: the delta rule without its erase term, x + beta v k
  weights_at_init   denseformer: the averaging weights at init, the plain transformer
  parallel_back     orthogonal: the parallel component put back, x + u
Each runs on its own copy of the checkpoint's model (best.pt by default, --ckpt to choose), through the run's own
evaluation (the same batches every time: eval_iters of each split, the checkpoint's unless given), and the table
gives the validation loss and its change from the model as trained. A mechanism that carries weight costs loss.
"""

import argparse
import copy
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
import configure  # noqa: E402
from orthogpt import ablations, checkpoint, errors, parallel  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402
from orthogpt.tasks import make_task  # noqa: E402


def evaluate(task, model, env, eval_iters):
    return task.evaluate(model, env.autocast, False, eval_iters)['val_loss']


@errors.entry
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out_dir', required=True, help='the trained run')
    p.add_argument('--ckpt', default=None, help=checkpoint.CHOICE)
    p.add_argument('--what', default=None, help='ablations, comma-separated (default: every one its rule has)')
    p.add_argument('--eval_iters', type=int, default=None, help="batches per split (default: the run's)")
    p.add_argument('--data_dir', default=None, help="the dataset's folder (default: the run's)")
    p.add_argument('--device', default='cpu', help="'cpu', 'cuda', 'cuda:N', 'auto'")
    args = p.parse_args(argv)
    ckpt, path = checkpoint.load_chosen(args.out_dir, args.ckpt)
    keys = {**ckpt['config'], 'device': args.device, 'compile': False, 'init_from': 'scratch',
            **({'data_dir': args.data_dir} if args.data_dir else {})}
    cfg = configure.from_dict(keys)
    env = parallel.setup(cfg)
    task = make_task(cfg, env.device)
    model = task.model()
    checkpoint.load_weights(model, ckpt, path)
    model.to(env.device)
    table = ablations.available(model)
    chosen = args.what.split(',') if args.what else list(table)
    unknown = [w for w in chosen if w not in table]
    if unknown or not chosen:
        raise UserError(f"{', '.join(unknown) or 'no ablation'}: residual={cfg.residual!r} has "
                        f"{', '.join(table) or 'no ablation'} (orthogpt/ablations.py lists them with their rules)")
    eval_iters = args.eval_iters or cfg.eval_iters
    base = evaluate(task, model, env, eval_iters)
    print(f"{path}: residual={cfg.residual!r}, iteration {ckpt['iter_num']}, {eval_iters} batches per split\n")
    print("| ablation | val loss | change |\n|---|---|---|")
    print(f"| none (as trained) | {base:.4f} | - |")
    fresh = task.model().to(env.device)  # the rules' initial values
    for name in chosen:
        ablated = copy.deepcopy(model)
        table[name](ablated, fresh)
        loss = evaluate(task, ablated, env, eval_iters)
        print(f"| {name} | {loss:.4f} | {loss - base:+.4f} |")


if __name__ == '__main__':
    main()
