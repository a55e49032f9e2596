"""The orthogonal Q/K/V maps of a model (model.OrthogonalQKV, O-ViT's Cayley and exp maps) computed once, in one
batched call, and held for every forward until released: a training step's micro-steps, or an evaluation."""

from contextlib import contextmanager

import torch
from torch.nn.utils import parametrize

from model import OrthogonalQKV


def batched_maps(model):
    """{map: its value} for every orthogonal Q/K/V parametrization in model, from one batched call
    per kind and shape: on a GPU a d x d solve is mostly latency, so all layers cost about one."""
    groups, values = {}, {}
    for m in model.modules():
        if parametrize.is_parametrized(m, 'weight') and isinstance(m.parametrizations.weight[0], OrthogonalQKV):
            p, w = m.parametrizations.weight[0], m.parametrizations.weight.original
            groups.setdefault((p.kind, w.shape, w.dtype, w.device), []).append((p, w))
    for group in groups.values():
        stacked = group[0][0](torch.stack([w for _, w in group]))  # (layers, 3d, d), one call
        values.update((p, q) for (p, _), q in zip(group, stacked.unbind(0)))
    return values


@contextmanager
def maps_held(model, grad=False):
    """Every orthogonal Q/K/V map computed once, in one batched call, and reused by every forward
    until exit: the weights must not change inside. With grad=True the values keep their graph,
    for one backward (a training step holds them across its micro-steps). Yields {map: value}."""
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        values = batched_maps(model)
    for p, value in values.items():
        p.held = value
    try:
        yield values
    finally:
        for p in values:
            p.held = None
