"""What a resumed run may change. A run continues its checkpoint with the same model, except for
the keys in SWITCHABLE, which choose the update rule (and its options) or only the initial
weights; a changed rule must build the same parameters (Oh et al., "Revisiting Residual
Connections: Orthogonal Updates for Stable and Efficient Deep Networks", arXiv:2505.11881,
Sec. 4.3: switching between additive and orthogonal updates mid-training)."""

from dataclasses import asdict, fields

import torch

import configure

SWITCHABLE = {'residual', 'options', 'dropout', 'init', 'sigma_w', 'sigma_qk'}
UNRECORDED = {'init_from', 'eval_only', 'reset_optimizer'}  # how a run was started, not what it is


def parameter_shapes(cfg):
    """{name: shape} of the model cfg builds, built on the meta device (no memory, no init)."""
    with torch.device('meta'):
        return {n: tuple(t.shape) for n, t in configure.build_model(cfg).state_dict().items()}


def problems(saved, cfg):
    """Why the model of config `cfg` cannot continue one saved with config `saved` (empty if it can).
    A changed residual rule is refused where the two rules build different parameters."""
    found = []
    for k in (f.name for f in fields(type(configure.model_config(cfg)))):
        before, now = getattr(saved, k), getattr(cfg, k)
        if before == now or k in SWITCHABLE or k == 'vocab_size':  # the task explains a vocabulary change
            continue
        if k == 'block_size':
            found.append(f"block_size={now}: the checkpoint's position table has {before} positions; "
                         f"resume with --block_size={before}")
        else:
            found.append(f"{k}={before!r} (saved) vs {now!r} (now)")
    if saved.model != cfg.model:
        found.append(f"model={saved.model!r} (saved) vs {cfg.model!r} (now)")
    if not found and (saved.residual, saved.options) != (cfg.residual, cfg.options):
        old, new = parameter_shapes(saved), parameter_shapes(cfg)
        if old != new:
            differ = sorted({n for n, _ in set(old.items()) ^ set(new.items())})
            before, now = asdict(saved.options), asdict(cfg.options)
            change = (f"residual {saved.residual!r} -> {cfg.residual!r}: the two rules" if saved.residual != cfg.residual
                      else ', '.join(f"{k} {before[k]!r} -> {v!r}" for k, v in now.items() if before[k] != v)
                      + f": the two settings of {cfg.residual!r}")
            found.append(f"{change} build different parameters ({', '.join(differ[:3])}"
                         f"{', ...' if len(differ) > 3 else ''}), so the weights do not carry over; switch between "
                         f"rules that keep them, such as 'additive' and 'orthogonal'")
    if saved.optimizer != cfg.optimizer and not cfg.reset_optimizer:
        found.append(f"optimizer {saved.optimizer!r} -> {cfg.optimizer!r}: the saved state is the other one's; "
                     f"add --reset_optimizer=True to start the new optimizer (and the schedule) there")
    return found


def refusal(out_dir, found):
    """The one line that refuses to continue the run in out_dir, with the problems found (problems())."""
    return f"cannot resume from {out_dir} with this config: " + '; '.join(found)


def changes(saved, cfg):
    """{key: [saved value, new value]} of every recorded key the run changes."""
    old, new = asdict(saved), asdict(cfg)
    return {k: [v, new[k]] for k, v in old.items() if k not in UNRECORDED and v != new[k]}
