"""Causal ablations at evaluation: one mechanism of a trained model switched off in place, with no retraining
(tools/ablate.py). A mechanism that carries weight costs loss when it is removed.

Each ablation is declared for the rule classes it applies to (a subclass takes its parent's: mHC takes
Hyper-Connections'), and edits the model's rule modules in place, the read-out of a depth rule included. Where it
puts a parameter back at its initial value, the value comes from a model built anew from the same config, so that
the initialisation is the rule's own code in model.py, not a copy of it.
"""

import math
import types

import torch

from model import (AdditiveUpdate, AttentionResidual, DeltaUpdate, DenseFormerUpdate, HyperConnection,
                   ManifoldHyperConnection, OrthogonalUpdate, dot, wide)


def rule_modules(model):
    """(owner, attribute, module) of every update rule of the model, in forward order, a depth rule's read-out last."""
    found = [(b, name, getattr(b, name)) for b in model.blocks for name in ('update_attn', 'update_mlp')]
    return found + ([(model, 'read_out', model.read_out)] if model.read_out is not None else [])


def twins(model, fresh, cls):
    """(trained, initial) pairs of the rule modules of class cls, the initial from the model built anew."""
    return [(m, f) for (_, _, m), (_, _, f) in zip(rule_modules(model), rule_modules(fresh)) if isinstance(m, cls)]


def put_back(m, f, name, index=slice(None)):
    """m's parameter `name` (its part `index`) set to f's, its initial value, where m has it."""
    if getattr(m, name, None) is not None:
        getattr(m, name)[index] = getattr(f, name)[index]


COLUMN = lambda j: (slice(None), j)  # noqa: E731  (columns j of a matrix)


@torch.no_grad()
def mixing_identity(model, fresh):
    """H_res := I ([HC]'s A_r, [mHC]'s H_res): the copies are still read and written, never mixed."""
    for m, f in twins(model, fresh, HyperConnection):
        if isinstance(m, ManifoldHyperConnection):  # made an mhc_res='identity' rule, which its twin() builds (the
            m.res, m.b_res, m.a_res = 'identity', None, None  # kernels' proof), H_pre's and H_post's products kept
            if m.dynamic:
                m.phi = torch.nn.Parameter(m.phi[:, :2 * m.n].clone())
        else:  # A_r^T = static_alpha[:, 1:] + s_alpha tanh(H_bar W_alpha[:, 1:]), at init I and 0 (W = [W_alpha | W_beta])
            put_back(m, f, 'static_alpha', COLUMN(slice(1, None)))
            put_back(m, f, 'W', COLUMN(slice(1, m.n + 1)))


@torch.no_grad()
def maps_at_init(model, fresh):
    """The read and write weights as the rule starts them, the same for every token; only the mixing stays learned."""
    for m, f in twins(model, fresh, HyperConnection):
        if isinstance(m, ManifoldHyperConnection):  # H_pre, H_post: sigmoid(a x' phi[:, :2n] + b)
            for name in ('b_pre', 'b_post', 'a_pre', 'a_post'):
                put_back(m, f, name)
            put_back(m, f, 'phi', COLUMN(slice(0, 2 * m.n)))
        else:  # A_m: static_alpha[:, 0] and its product's column W[:, 0]; B: static_beta and W_beta, W's last column
            for name, index in (('static_alpha', COLUMN(0)), ('W', COLUMN(0)), ('static_beta', slice(None)),
                                ('W', COLUMN(-1))):
                put_back(m, f, name, index)


@torch.no_grad()
def uniform_depth(model, fresh):
    """[AttnRes]'s queries at 0, their init: every read the uniform mean of its sources."""
    for m, f in twins(model, fresh, AttentionResidual):
        put_back(m, f, 'query')


@torch.no_grad()
def beta_zero(model, fresh):
    """[DDL]'s gate beta := 0 (b = -inf in 2 sigmoid(w . c + b)): every sublayer the identity shortcut, x_next = x."""
    for m, _ in twins(model, fresh, DeltaUpdate):
        m.b_beta.fill_(-math.inf)


def write_only_forward(self, x, u, sub=None):
    """[DDL] without its erase: x + beta v k, the delta rule's write alone (the term -beta <k, x> k dropped)."""
    xf, uf = wide(x), wide(u)
    c = torch.nn.functional.rms_norm(xf, xf.shape[-1:])
    k = uf * torch.rsqrt(dot(uf, uf) + self.eps ** 2)
    beta = 2 * torch.sigmoid(dot(c, self.w_beta) + self.b_beta)
    return (xf + beta * dot(c, self.w_v) * k).to(x.dtype)


def write_only(model, fresh):
    """[DDL]'s sublayers without the erase term (write_only_forward), with their learned weights."""
    for m, _ in twins(model, fresh, DeltaUpdate):
        m.forward = types.MethodType(write_only_forward, m)


@torch.no_grad()
def weights_at_init(model, fresh):
    """[DenseFormer]'s averaging weights at their init, each block's own output alone: the plain transformer."""
    for m, f in twins(model, fresh, DenseFormerUpdate):
        put_back(m, f, 'alpha')


def parallel_back(model, fresh):
    """[Oh]'s orthogonal updates with the parallel component put back: x + u, additive, the same weights."""
    for owner, name, m in rule_modules(model):
        if isinstance(m, OrthogonalUpdate):
            setattr(owner, name, AdditiveUpdate())


# rule class -> {ablation: function(model, fresh)}; a rule takes those of every class it is an instance of
ABLATIONS = {
    HyperConnection: {'mixing_identity': mixing_identity, 'maps_at_init': maps_at_init},
    AttentionResidual: {'uniform_depth': uniform_depth},
    DeltaUpdate: {'beta_zero': beta_zero, 'write_only': write_only},
    DenseFormerUpdate: {'weights_at_init': weights_at_init},
    OrthogonalUpdate: {'parallel_back': parallel_back},
}


def available(model):
    """{ablation: function} for the rules the model holds."""
    return {name: f for cls, table in ABLATIONS.items() for name, f in table.items()
            if any(isinstance(m, cls) for _, _, m in rule_modules(model))}
