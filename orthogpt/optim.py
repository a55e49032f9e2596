"""The optimizer, its learning-rate schedule, and one optimizer step: AdamW alone or Muon beside
it, linear warmup and cosine decay, gradient accumulation, clipping, loss scaling, and the skip of
a step whose loss or gradients are not finite."""

import math
import re

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from model import ResidualUpdate, ScaleVector, StreamAnchor, raw
from orthogpt.errors import UserError
from orthogpt.parallel import local_norms, maps_of, synchronising, unwrapped


WARMUP_SHARE = 0.2  # the most of a schedule its warmup takes: a short run warms up, peaks and decays


def warmup(cfg, start=0):
    """(the iterations of warmup, of the whole schedule) from `start`: warmup_iters, or WARMUP_SHARE
    of the schedule where warmup_iters would take more of it (--max_iters=100 on a recipe that warms
    up for 100 would end at its peak rate, never decaying)."""
    decay_iters = (cfg.max_iters if cfg.lr_decay_iters is None else cfg.lr_decay_iters) - start
    return min(cfg.warmup_iters, int(WARMUP_SHARE * decay_iters)), decay_iters


def warmup_note(cfg, start=0):
    """The line a run prints where warmup() shortens its warmup, or None."""
    iters, decay_iters = warmup(cfg, start)
    if not cfg.decay_lr or iters == cfg.warmup_iters:
        return None
    return (f"warmup_iters={cfg.warmup_iters} would take {cfg.warmup_iters / decay_iters:.0%} of the schedule's "
            f"{decay_iters} iterations: warming up over {iters} instead, so that the rate peaks and decays")


def get_lr(it, cfg, start=0):
    """The learning rate at iteration it: linear warmup from `start` (0, or where the optimizer was
    reset) over warmup_iters, at most WARMUP_SHARE of the schedule, then cosine decay to
    min_lr_ratio of the peak at lr_decay_iters (default: max_iters); Muon's rate follows the same
    fraction of its own peak."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    min_lr = cfg.learning_rate * cfg.min_lr_ratio
    warmup_iters, decay_iters = warmup(cfg, start)
    it -= start
    if it < warmup_iters:
        return cfg.learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - min_lr)


def get_momentum(it, cfg, start=0):
    """Muon's momentum at iteration it: from 0.85 up to muon_momentum over muon_momentum_warmup
    iterations (modded-nanogpt's records: 0.85 to 0.95 over 300), then muon_momentum."""
    if not cfg.muon_momentum_warmup:
        return cfg.muon_momentum
    frac = min((it - start) / cfg.muon_momentum_warmup, 1.0)
    return (1 - frac) * min(0.85, cfg.muon_momentum) + frac * cfg.muon_momentum


def schedule(optimizer, it, cfg, start=0):
    """Set every group's learning rate (and Muon's momentum) for iteration it; returns the rate."""
    lr = get_lr(it, cfg, start)
    optimizer.set_lr(lr / cfg.learning_rate)
    optimizer.set_momentum(get_momentum(it, cfg, start))
    return lr


class SplitMuon(torch.optim.Muon):
    """torch.optim.Muon ([Muon] K. Jordan et al., 2024) on matrices, where a matrix that stacks
    several (Q, K and V in one (3d, d) weight) is orthogonalised block by block: a param group's
    `split` = n cuts its matrices into n equal row blocks, each with its own Newton-Schulz step and
    shape scaling, as the modded-nanogpt records treat Q, K and V. The blocks are views: the
    update lands in the stacked weight and its one momentum buffer."""

    def _init_group(self, group, params, grads, bufs):
        first = len(params)
        has_complex = super()._init_group(group, params, grads, bufs)
        for found in (params, grads, bufs):
            found[first:] = [block for t in found[first:] for block in t.chunk(group['split'])]
        return has_complex


class Optimizers:
    """AdamW alone, or torch.optim.Muon for the blocks' matrices beside AdamW for the rest, stepped
    as one. Every param group keeps its own learning rate ('base_lr') for the schedule to scale."""

    def __init__(self, **named):
        self.named = named
        self.base = {name: [g['base_lr'] for g in o.param_groups] for name, o in named.items()}

    def __iter__(self):
        return iter(self.named.values())

    @property
    def param_groups(self):
        return [g for o in self for g in o.param_groups]

    def set_lr(self, fraction):
        """Each group at its base learning rate times fraction (the schedule's)."""
        for group in self.param_groups:
            group['lr'] = group['base_lr'] * fraction

    def set_momentum(self, momentum):
        """Muon's momentum (the schedule's), if Muon is one of them."""
        for group in self.named['muon'].param_groups if 'muon' in self.named else ():
            group['momentum'] = momentum

    def summary(self, names):
        """Which parameters each optimizer takes, with counts; names: {parameter: its name}."""
        lines = []
        for name, o in self.named.items():
            params = [p for g in o.param_groups for p in g['params']]
            split = [p for g in o.param_groups if g.get('split', 1) > 1 for p in g['params']]
            lines.append(f"{name}: {len(params)} tensors, {sum(p.numel() for p in params):,} parameters"
                         + (f" ({len(split)} stacked weights orthogonalised block by block)" if split else '')
                         + ": " + ', '.join(sorted({shorten(names[p]) for p in params})))
        return lines

    def zero_grad(self, set_to_none=True):
        for o in self:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {name: o.state_dict() for name, o in self.named.items()}

    def load_state_dict(self, state):
        for name, o in self.named.items():
            o.load_state_dict(state[name])
        self.keep_base_lr()

    def keep_base_lr(self):
        """Each group's base learning rate from the config again: loading a state replaces the
        groups with the saved ones, whose rates are the old run's."""
        for name, o in self.named.items():
            for group, lr in zip(o.param_groups, self.base[name]):
                group['base_lr'] = lr


def decayed(module, name, p):
    """Whether weight decay applies to the parameter `name` of `module` (its own, not a submodule's), by the kind of
    module: gains, biases and scaling vectors do not decay, nor does the raw W behind an orthogonal Q/K/V (decaying it
    pulls Q, K, V towards the identity, not towards zero); the weights of Linear, Embedding and Conv2d do. Any other
    parameter, the model's own among them (the ViT's embeddings), decays if it is a matrix or more."""
    if isinstance(module, (nn.Linear, nn.Embedding, nn.Conv2d)):
        return name == 'weight'
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm, ScaleVector, StreamAnchor, parametrize.ParametrizationList)):
        return False
    return p.dim() >= 2


def rule_parameters(model):
    """{parameter: whether it is decayed} of every rule's parameters, in its submodules too: they are the rule's, which
    decays its matrices but those it names (by their name within it) in no_decay."""
    return {p: p.dim() >= 2 and name not in rule.no_decay for rule in model.modules()
            if isinstance(rule, ResidualUpdate) for name, p in rule.named_parameters()}


def decay_groups(model):
    """{parameter: whether it is decayed} for every trainable parameter: a rule's as the rule declares, any other as
    decayed() says of each module that holds it (a tied weight by each), which must agree."""
    claims, owned = {}, rule_parameters(model)
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if p.requires_grad:
                claims.setdefault(p, set()).add(owned[p] if p in owned else decayed(module, name, p))
    names = {p: n for n, p in model.named_parameters()}
    for p, found in claims.items():
        if len(found) > 1:
            raise UserError(f"parameter {names[p]} is claimed as decayed and as not by the modules that hold it (a "
                            f"tied weight): hold it where both agree (orthogpt.optim.decayed)")
    return {p: found.pop() for p, found in claims.items()}


def muon_split(name, cfg):
    """The matrices that a weight stacks, which Muon orthogonalises each alone: Q, K and V in
    attention's c_attn (or its raw W); u and v in a gated MLP's c_fc."""
    return 3 if '.attn.c_attn.' in name else 2 if '.mlp.c_fc.' in name and cfg.mlp == 'gated' else 1


def make_optimizer(model, cfg, device_type):
    """AdamW, with weight decay as decay_groups says. Fused where PyTorch has the kernel (CUDA, CPU):
    one kernel for all parameters, and the scaler's skip of a non-finite step stays on the device.
    With optimizer='muon', Muon (SplitMuon) takes the weights of the blocks' Linear layers
    (attention and MLP, the raw W behind Q/K/V maps), each matrix of a stacked weight alone, at
    muon_lr with muon_weight_decay; AdamW keeps the embeddings, head, gains, biases, scaling vectors
    and a rule's own parameters."""
    decays = decay_groups(model)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    matrices = ({raw(m) for m in model.blocks.modules() if isinstance(m, nn.Linear)} - set(rule_parameters(model))
                if cfg.optimizer == 'muon' else set())
    muon = [(n, p) for n, p in params if p in matrices]
    rest = [(n, p) for n, p in params if p not in matrices]

    def groups(named, lr, weight_decay, split=False):  # decayed ones first, then the others
        found = {}
        for decay, members in ((weight_decay, [x for x in named if decays[x[1]]]),
                               (0.0, [x for x in named if not decays[x[1]]])):
            for n, p in members:
                found.setdefault((decay, muon_split(n, cfg) if split else 1), []).append(p)
        return [{'params': ps, 'weight_decay': decay, 'base_lr': lr, **({'split': n} if split else {})}
                for (decay, n), ps in found.items()]
    adamw = torch.optim.AdamW(groups(rest, cfg.learning_rate, cfg.weight_decay), lr=cfg.learning_rate,
                              betas=(cfg.beta1, cfg.beta2), fused=device_type in ('cuda', 'cpu'))
    if not muon:
        return Optimizers(adamw=adamw)
    wd = cfg.weight_decay if cfg.muon_weight_decay is None else cfg.muon_weight_decay
    return Optimizers(adamw=adamw, muon=SplitMuon(groups(muon, cfg.muon_lr, wd, split=True), lr=cfg.muon_lr,
                                                  momentum=cfg.muon_momentum))


def shorten(name):
    """A parameter's name with its block index dropped: blocks.3.attn.c_proj.weight -> attn.c_proj.weight."""
    return re.sub(r'^blocks\.\d+\.', '', name)


class StepScaler(torch.amp.GradScaler):
    """Loss scaling for float16, and for every dtype a guard: a step whose gradients hold inf or
    nan is skipped (on the device when AdamW is fused, as on CUDA and CPU: no host sync).
    Outside float16 the scale stays 1, so the arithmetic is exactly that of unscaled training."""

    def __init__(self, device_type, dtype):
        self.dynamic = dtype == 'float16'
        super().__init__(device_type, init_scale=2.0 ** 16 if self.dynamic else 1.0)

    def update(self, new_scale=None):
        super().update(new_scale if self.dynamic else 1.0)

    def inverse(self):
        """1 / the current scale, as a device tensor (no host sync)."""
        return self._scale.reciprocal()


class NonFinite:
    """Steps whose loss or gradients were not finite, tallied on the device; check() reads the
    tally (one host sync), which the training loop does once per log interval."""

    def __init__(self, names, device):
        self.names, self.device = names, device
        self.bad_params = torch.zeros(len(names), dtype=torch.bool, device=device)
        self.stats = torch.tensor([0, -1, 0], device=device)  # bad steps, first bad iteration, streak

    def record(self, iter_num, loss, grad_norms):
        bad_params = ~torch.isfinite(grad_norms)
        bad = (bad_params.any() | ~torch.isfinite(loss)).long()
        self.bad_params |= bad_params
        count, first, streak = self.stats
        self.stats = torch.stack([count + bad, torch.where((first < 0) & (bad > 0), iter_num, first),
                                  (streak + 1) * bad])

    def check(self):
        """(bad steps, first bad iteration, current streak, parameter names) since the last check."""
        count, first, streak = self.stats.tolist()
        names = [n for n, bad in zip(self.names, self.bad_params.tolist()) if bad] if count else []
        self.stats = torch.tensor([0, -1, streak], device=self.device)
        self.bad_params.zero_()
        return count, first, streak, names


def hold_across_micro_steps(maps, micro_step, micro_steps):
    """The orthogonal Q/K/V maps of one optimizer step (maps {map: value}, computed once by
    model.maps_held) across its micro-steps: until the last one, backward stops at a leaf copy of
    each value, where the gradients sum; the last backward runs through the maps once with that sum
    added, so the raw weights (and DDP's hooks on them) get the whole step's gradient at once."""
    for p, value in maps.items():
        if micro_step == 0:
            p.held = value.detach().requires_grad_()
        elif micro_step == micro_steps - 1 and p.held.grad is not None:
            extra, p.held = p.held.grad, value.view_as(value)
            p.held.register_hook(lambda g, extra=extra: g + extra)
        elif micro_step == micro_steps - 1:
            p.held = value


def train_step(model, optimizer, scaler, next_batch, micro_steps, grad_clip, amp, env=None):
    """One optimizer step over micro_steps micro-batches from next_batch(); gradients average
    over micro-batches (and over env's processes, reduced on the last micro-step only), under the
    autocast context amp. The orthogonal Q/K/V maps are computed once for all micro-steps, except
    under FSDP, where each layer's raw W is whole only inside its own forward. A step with an
    inf/nan gradient anywhere is skipped, by every optimizer and every FSDP shard alike. Then the
    residual rule's after_step. Returns the last micro-batch's loss and the parameters' gradient
    norms (one tensor, in param_groups' order), on the device: nothing syncs, except Muon's step, which reads the scaler's verdict."""
    with maps_of(model, env, grad=True) as maps:
        for micro_step in range(micro_steps):
            x, y = next_batch()
            if micro_steps > 1:
                hold_across_micro_steps(maps, micro_step, micro_steps)
            with synchronising(model, env, micro_step == micro_steps - 1), amp:
                _, loss = model(x, y)
            scaler.scale(loss / micro_steps).backward()
    grads = [p.grad for group in optimizer.param_groups for p in group['params']]
    norms = local_norms(torch.stack(torch._foreach_norm(grads))) * scaler.inverse()  # clip_grad_norm_'s, per parameter
    # one pass over the gradients: the clipping factor (scaling by the scaler's power of two
    # commutes with it exactly), or nan everywhere where any gradient is non-finite, since the
    # scaler skips only an optimizer whose own gradients are: the whole step is skipped, not a part
    clip = torch.clamp(grad_clip / (torch.linalg.vector_norm(norms) + 1e-6), max=1.0) if grad_clip > 0 else 1.0
    torch._foreach_mul_(grads, torch.where(torch.isfinite(norms).all(), clip, float('nan')))
    for opt in optimizer:
        scaler.unscale_(opt)
    for opt in optimizer:  # Muon, without the fused kernels' on-device skip, reads the scaler's verdict
        scaler.step(opt)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    unwrapped(model).after_step()
    return loss.detach(), norms


def oom_advice(cfg, first):
    """What to change when a training step runs out of memory (the first one, or a later one)."""
    step = 'the first training step' if first else 'a training step'
    b, g = cfg.batch_size, cfg.gradient_accumulation_steps
    fix = (f"lower batch_size and raise gradient_accumulation_steps by the same factor, which keeps the tokens "
           f"per step: --batch_size={b // 2} --gradient_accumulation_steps={g * 2}" if b > 1 else
           "lower block_size, or the model size (n_layer, n_embd)")
    return f"out of memory in {step} (batch_size={b}, block_size={cfg.block_size}, gradient_accumulation_steps={g}): {fix}"
