"""Measurements of the residual stream, through hooks on the update modules (forward(x, u)).

Residual layer l = 1 .. 2L is the output of the l-th update (attention of block 0, MLP of block
0, attention of block 1, ...), x^(l) in the notation of "The Orthogonal Transformer" (preprint,
no arXiv id). "Oh et al." below: G. Oh et al., "Revisiting Residual Connections: Orthogonal Updates for Stable and Efficient Deep
Networks", NeurIPS 2025, arXiv:2505.11881. H_res: the mixing of the copies of mHC, Z. Xie et al., "mHC: Manifold-Constrained
Hyper-Connections", arXiv:2512.24880 (Eq. 3).
"""

import math
from contextlib import contextmanager

import torch

from model import wide


def updates(model):
    """(block, sublayer, module) for every update rule, in forward order: each block updates the
    stream twice, after its attention and after its MLP (a depth rule's read of the output is no update)."""
    return [(i, sub, m) for i, b in enumerate(model.blocks) for sub, m in (('attn', b.update_attn), ('mlp', b.update_mlp))]



@contextmanager
def residual_grads(model):
    """Yields a list that backward() fills with the mean per-token L2 norm of d loss / d x^(l),
    one float32 device scalar per residual layer, in layer order."""
    grads = [None] * (2 * len(model.blocks))

    def hook(l):
        def forward_hook(module, inputs, output):
            def store(g):  # a wider stream's copies (..., n, d) count as one vector per token
                grads[l] = g.float().flatten(2).norm(dim=-1).mean()
            output.register_hook(store)
        return forward_hook
    handles = [m.register_forward_hook(hook(l)) for l, (_, _, m) in enumerate(updates(model))]
    try:
        yield grads
    finally:
        for h in handles:
            h.remove()


STATS = ('stream_sq', 'par_sq', 'perp_sq', 'cos', 'theta', 'res_offdiag', 'res_dist', 'res_angle')
ORTHOGONAL_TOL = 1e-4  # the largest |H_res^T H_res - I| at which H_res counts as orthogonal (float32 rounding)


def mixing_stats(module, x):
    """H_res of an mHC sublayer (module.coefficients, (..., n, n) per token, None for the identity) on its stream x
    (..., n, d), as three means over the tokens (float32, (3,)):

        res_offdiag  the off-diagonal mass, mean over rows i of 1 - H_res[i, i]: for a doubly stochastic H_res the
                     share of each copy's new value taken from the other copies (0 for I, 1 - 1/n for J/n); for
                     an orthogonal one (n - tr H_res) / n = (2/n) sum_k (1 - cos theta_k), theta_k as below;
        res_dist     ||H_res - I||_F, the Frobenius norm;
        res_angle    for an orthogonal H_res (every token's within ORTHOGONAL_TOL, as the Cayley map gives), the
                     angle of its rotation: the largest angle between a vector v of R^n and H_res v,
                     max_k theta_k in [0, pi], theta_k = |arg lambda_k| over H_res's eigenvalues lambda_k =
                     e^(+-i theta_k); NaN where H_res is not orthogonal.

    HC's A_r likewise (not constrained, so 1 - A_r[i, i] is no share: a measure of how far A_r left I); NaN for all
    three where the rule keeps one stream."""
    coefficients = getattr(module, 'coefficients', None)
    if coefficients is None:
        return torch.full((3,), math.nan, device=x.device)
    res = coefficients(wide(x))[2]
    if res is None:  # the identity: never mixed, a rotation by 0
        return torch.zeros(3, device=x.device)
    res = res.double().flatten(0, -3)  # (tokens, n, n)
    eye = torch.eye(res.shape[-1], dtype=res.dtype, device=res.device)
    offdiag = (1 - res.diagonal(dim1=-2, dim2=-1)).mean()
    dist = torch.linalg.matrix_norm(res - eye).mean()
    angle = torch.tensor(math.nan, dtype=res.dtype, device=res.device)
    if (res.mT @ res - eye).abs().max() <= ORTHOGONAL_TOL:
        angle = torch.linalg.eigvals(res).angle().abs().amax(-1).mean()
    return torch.stack([offdiag, dist, angle]).float()


@torch.no_grad()
def update_stats(model, idx):
    """Per update, means over tokens of ||x||^2, ||f_par||^2, ||f_perp||^2 and cos(x, f), f the branch output and x
    what the branch read (the input of its norm: the stream of a one-stream rule, the read of a wider one, the mixture
    over depth of Attention Residuals) (Oh et al. Sec. 3.5, App. D), and theta = ||f_perp|| / ||x||: on the sphere
    ||x|| = sqrt(d) the angle the Orthogonal Transformer's rotation turns x by, for any rule the size of the
    tangential update relative to what it read. One forward pass on idx (B, T), in the model's current mode; returns
    a (2L, 8) float32 device tensor, rows in layer order."""
    rows, reads = [None] * (2 * len(model.blocks)), [None] * (2 * len(model.blocks))

    def read_hook(l):
        def pre_hook(module, args):
            reads[l] = args[0]
        return pre_hook

    def hook(l):
        def pre_hook(module, args):
            x, u = reads[l].float(), args[1].float()
            xx, uu, xu = (x * x).sum(-1), (u * u).sum(-1), (x * u).sum(-1)  # (B, T)
            par = xu * xu / xx
            perp = (uu - par).clamp_min(0)
            theta = (perp / xx).sqrt()
            stream = torch.stack([xx.mean(), par.mean(), perp.mean(), (xu / (xx * uu).sqrt()).mean(), theta.mean()])
            rows[l] = torch.cat([stream, mixing_stats(module, args[0])])
        return pre_hook
    norms = [n for b in model.blocks for n in (b.ln_1, b.ln_2)]
    handles = [n.register_forward_pre_hook(read_hook(l)) for l, n in enumerate(norms)]
    handles += [m.register_forward_pre_hook(hook(l)) for l, (_, _, m) in enumerate(updates(model))]
    try:
        model(idx)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(rows)


def stats_record(iter_num, model, stats):
    """The JSON-ready form of update_stats: {'iter', 'attn': {stat: [per block]}, 'mlp': {...}}."""
    values = stats.tolist()
    record = {'iter': iter_num, 'attn': {s: [] for s in STATS}, 'mlp': {s: [] for s in STATS}}
    for (_, sub, _), row in zip(updates(model), values):
        for s, v in zip(STATS, row):
            record[sub][s].append(None if math.isnan(v) else v)
    return record


@torch.no_grad()
def effective_rank(features):
    """exp of the entropy of the normalised eigenvalues of the feature covariance (Oh et al.,
    slides: "Effective Rank ... exp(H)"): features (..., d), rows are samples."""
    h = features.reshape(-1, features.shape[-1]).double()
    h = h - h.mean(0)
    eig = torch.linalg.eigvalsh(h.T @ h / h.shape[0]).clamp_min(0)
    p = eig / eig.sum()
    return math.exp(-(p * torch.log(p.clamp_min(1e-300))).sum().item())


@torch.no_grad()
def final_features(model, idx):
    """The representation the head reads: the output of model.ln_f, (B, T, d)."""
    out = []
    handle = model.ln_f.register_forward_hook(lambda m, i, o: out.append(o))
    try:
        model(idx)
    finally:
        handle.remove()
    return out[0]


def in_eval_mode(measure):
    """measure(model, ...) run in eval mode (no dropout; stochastic connections at their expected
    update, so no random number is drawn), the model back in training mode after."""
    def measured(model, *args):
        model.eval()
        try:
            return measure(model, *args)
        finally:
            model.train()
    return measured


@in_eval_mode
def dynamics_record(model, idx, iter_num):
    """update_stats of one forward on idx, as the JSON record of dynamics.jsonl."""
    return stats_record(iter_num, model, update_stats(model, idx))


@in_eval_mode
def final_rank(model, idx):
    """The effective rank of the representation the head reads (Oh et al., App. D)."""
    return effective_rank(final_features(model, idx))
