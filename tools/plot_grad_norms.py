"""Layer-wise gradient norms, per variant: the figure of "The Orthogonal Transformer" (preprint, no arXiv id).

    python tools/plot_grad_norms.py config/shakespeare_add.py config/shakespeare_rot.py --sigma_w=0.2,0.4,0.6,0.8,1.0
    python tools/plot_grad_norms.py config/shakespeare_rot.py --step=500 --batch_size=16   # after 500 steps
    python tools/plot_grad_norms.py --ckpt=out-shakespeare-rot/ckpt.pt       # or --ckpt=out-shakespeare-rot: its best.pt

For each config (and each sigma_w of the sweep) the model is built at initialisation (or trained
--step steps from it with the config's optimizer and schedule, or loaded with --ckpt), then the
loss is back-propagated on --batches real training batches, and the mean per-token L2 norm of
d loss / d x^(l) is recorded for every residual layer l = 1..2L (the output of each attention
and MLP update; even l are block outputs), averaged over batches and --seeds initialisations.
Writes OUT.csv (one row per config, sigma_w and layer) and OUT.png (one panel per config, one
line per sigma_w, log scale, with a 1/sqrt(l) reference for models with pre-norm blocks).
Other --key=value arguments override every config (e.g. --batch_size=8 for a quicker run).
"""

import argparse
import csv
import os
import statistics
import sys
from contextlib import nullcontext

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
import configure  # noqa: E402
from model import RESIDUALS  # noqa: E402
from orthogpt import checkpoint, diagnostics, errors, progress  # noqa: E402
from orthogpt.device import resolve_device  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402
from orthogpt.optim import StepScaler, make_optimizer, schedule, train_step  # noqa: E402
from orthogpt.rng import seed_all  # noqa: E402
from orthogpt.tasks import make_task  # noqa: E402


def build(cfg, step, chosen, tick=lambda: None):
    """The model to measure and the task that gives its training batches; tick() after each step.
    chosen: (checkpoint, path) to load, or None."""
    device = resolve_device(cfg.device)
    task = make_task(cfg, device)
    seed_all(cfg.seed)
    model = task.model().to(device)
    if chosen:
        checkpoint.load_weights(model, *chosen)
    device_type = device.split(':')[0]
    optimizer, scaler = make_optimizer(model, task.cfg, device_type), StepScaler(device_type, 'float32')
    for it in range(step):
        schedule(optimizer, it, task.cfg)
        train_step(model, optimizer, scaler, task.next_batch, task.cfg.gradient_accumulation_steps,
                   task.cfg.grad_clip, nullcontext())
        tick()
    return model, task


def load_config(path, sigma, seed, overrides, chosen):
    """The config of one measurement: a config file, or the chosen checkpoint's own config, with overrides."""
    extra = overrides + [f'--seed={1337 + seed}'] + ([f'--sigma_w={sigma}'] if sigma is not None else [])
    if path is None:
        cfg = configure.load(extra, base=configure.from_dict(chosen[0]['config']))
    else:
        cfg = configure.load([path] + extra)
    if sigma is not None and cfg.init != 'sigma':
        raise UserError(f"--sigma_w sweeps the 'sigma' initialisation, but {path} uses init={cfg.init!r}")
    return cfg


def measure(model, task, batches, tick=lambda: None):
    """(2L, batches) gradient norms, one column per batch; tick() after each batch. The backward
    pass computes d loss / d x^(l) alone, not the parameters' gradients, which the norms do not
    need: the same norms for about a third less work."""
    cols = []
    for _ in range(batches):
        x, y = task.next_batch()
        streams = []  # every update's output x^(l), what the gradient is taken with respect to
        keep = [m.register_forward_hook(lambda module, inputs, out: streams.append(out))
                for _, _, m in diagnostics.updates(model)]
        try:
            with diagnostics.residual_grads(model) as grads:
                _, loss = model(x, y)
                torch.autograd.grad(loss, streams, allow_unused=True)
        finally:
            for h in keep:
                h.remove()
        # nan where x^(l) does not reach the loss (Attention Residuals: the head reads its own mixture of the outputs)
        cols.append([float('nan') if g is None else g.item() for g in grads])
        tick()
    return [list(row) for row in zip(*cols)]


@errors.entry
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('configs', nargs='*', help='config files (one panel each) and --key=value overrides')
    p.add_argument('--sigma_w', default=None, help='comma-separated sweep (init=sigma); default: the config value')
    p.add_argument('--batches', type=int, default=4, help='training batches per measurement')
    p.add_argument('--seeds', type=int, default=3, help='initialisations to average over')
    p.add_argument('--step', type=int, default=0, help='train this many steps from initialisation first')
    p.add_argument('--ckpt', default=None, help="measure this checkpoint file instead (one config: its own), or a run's "
                                                "folder's best.pt (else its newest checkpoint that verifies)")
    p.add_argument('--out', default='out-plots/grad_norms', help='writes OUT.csv and OUT.png')
    args, overrides = p.parse_known_args(argv)
    files = [c for c in args.configs if not c.startswith('--')]
    overrides += [c for c in args.configs if c.startswith('--')]
    chosen = None
    if args.ckpt:
        if args.sigma_w or files:
            raise UserError("--ckpt measures one trained model: give neither config files nor --sigma_w")
        files = [None]
        where = [args.ckpt] if os.path.isdir(args.ckpt) else [os.path.dirname(args.ckpt), os.path.basename(args.ckpt)]
        chosen = checkpoint.load_chosen(*where)
    elif not files:
        raise UserError("give config files to measure (e.g. config/shakespeare_rot.py), or a trained model with --ckpt")
    sweep = [None] if args.sigma_w is None else [float(v) for v in args.sigma_w.split(',')]
    jobs = [(path, sigma, seed) for path in files for sigma in sweep for seed in range(args.seeds)]
    lines = {}  # (path, sigma) -> (config, per layer: the norms of every batch and seed)
    # the bar counts batches (the training steps' and the measured ones), for an ETA within seconds
    with progress.bar(total=len(jobs) * (args.step + args.batches), desc='measuring', unit='batch') as bar:
        tick = lambda: bar.update(1)  # noqa: E731
        for path, sigma, seed in jobs:
            cfg = load_config(path, sigma, seed, overrides, chosen)
            model, task = build(cfg, args.step, chosen, tick)
            norms = measure(model, task, args.batches, tick)
            cfg, samples = lines.get((path, sigma), (cfg, [[] for _ in norms]))
            lines[path, sigma] = cfg, [a + b for a, b in zip(samples, norms)]

    rows, panels = [], {}
    for (path, _), (cfg, samples) in lines.items():
        name = os.path.splitext(os.path.basename(path or chosen[1]))[0]
        label = f"sigma_w={cfg.sigma_w:g}" if cfg.init == 'sigma' else cfg.init
        means = [statistics.fmean(s) for s in samples]
        panels.setdefault(name, (cfg, []))[1].append((label, means))
        for l, s in enumerate(samples):
            rows.append({'config': name, 'residual': cfg.residual, 'qkv': cfg.qkv, 'init': cfg.init,
                         'sigma_w': cfg.sigma_w, 'step': args.step, 'layer': l + 1, 'block': l // 2,
                         'sublayer': ('attn', 'mlp')[l % 2], 'grad_norm': statistics.fmean(s),
                         'std': statistics.stdev(s) if len(s) > 1 else 0.0})
        print(f"{name} {label}: max/min over layers {max(means) / min(means):.2f}")

    os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
    with open(args.out + '.csv', 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(panels, args.out + '.png', args.step)
    print(f"wrote {args.out}.csv and {args.out}.png")


def plot(panels, path, step):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False, sharey=True)
    for ax, (name, (cfg, lines)) in zip(axes[0], panels.items()):
        layers = range(1, 2 * cfg.n_layer + 1)
        for label, means in lines:
            ax.plot(layers, means, marker='.', label=label)
        if not RESIDUALS[cfg.residual].keeps_norm:
            first = lines[-1][1][0]
            ax.plot(layers, [first / l ** 0.5 for l in layers], 'k--', lw=1, label='∝ 1/√l')
        ax.set_yscale('log')
        ax.set_xlabel('residual layer l (even: block outputs)')
        ax.set_title(f"{name}: {cfg.residual}, {cfg.n_layer} x {cfg.n_embd}" + (f", step {step}" if step else ''))
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel('mean per-token ||dL/dx^(l)||')
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == '__main__':
    main()
