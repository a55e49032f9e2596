"""Measurements of the residual stream, through hooks on the update modules (forward(x, u)).

Residual layer l = 1 .. 2L is the output of the l-th update (attention of block 0, MLP of block
0, attention of block 1, ...), x^(l) in the notation of "The Orthogonal Transformer" (preprint,
no arXiv id). "Oh et al." below: G. Oh et al., "Revisiting Residual Connections: Orthogonal Updates for Stable and Efficient Deep
Networks", NeurIPS 2025, arXiv:2505.11881. H_res: the mixing of the copies of mHC, Z. Xie et al., "mHC: Manifold-Constrained
Hyper-Connections", arXiv:2512.24880 (Eq. 3); its gains across depth are the "Amax Gain Magnitude" of its Sec. 3.1
(Fig. 3 and 7). The rules that look across depth: docs/rules.md; what each measurement across depth is, exactly:
docs/rules.md, "Diagnostics across depth".
"""

import math
from contextlib import contextmanager

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from model import AttentionResidual, DeltaUpdate, DenseFormerUpdate, dot, wide


def updates(model):
    """(block, sublayer, module) for every update rule, in forward order: each block updates the
    stream twice, after its attention and after its MLP (a depth rule's read of the output is no update)."""
    return [(i, sub, m) for i, b in enumerate(model.blocks) for sub, m in (('attn', b.update_attn), ('mlp', b.update_mlp))]


@contextmanager
def hooked(*handles):
    """The hooks `handles` removed on leaving, whatever happens inside."""
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def hooks(modules, fn, after=False):
    """A hook on each of modules calling fn(l, module, args) before its forward (after=True: fn(l, module, args,
    output) after it), l the module's place in the list; fn returns None, so that the hooks change nothing."""
    if after:
        return [m.register_forward_hook(lambda m, args, out, l=l: fn(l, m, args, out)) for l, m in enumerate(modules)]
    return [m.register_forward_pre_hook(lambda m, args, l=l: fn(l, m, args)) for l, m in enumerate(modules)]


def rules(model):
    """The update modules in forward order (updates)."""
    return [m for _, _, m in updates(model)]


def token_norm(t):
    """The mean over tokens of the L2 norm of each token's vector, a float32 device scalar; a wider stream's copies
    (B, T, n, d) count as one vector per token."""
    return t.float().flatten(2).norm(dim=-1).mean()


@contextmanager
def residual_grads(model, branch=False):
    """Yields a list that backward() fills with the mean per-token L2 norm of d loss / d x^(l),
    one float32 device scalar per residual layer, in layer order; branch=True: of d loss / d u^(l), the branch
    output that update l writes in. None where no gradient reaches: Attention Residuals' x^(l), the sources' sum,
    which nothing reads."""
    grads = [None] * (2 * len(model.blocks))

    def keep(l, t):
        def store(g):
            grads[l] = token_norm(g)
        t.register_hook(store)
    watch = (lambda l, m, args: keep(l, args[1])) if branch else (lambda l, m, args, out: keep(l, out))
    with hooked(*hooks(rules(model), watch, after=not branch)):
        yield grads


STATS = ('stream_sq', 'par_sq', 'perp_sq', 'cos', 'theta', 'res_offdiag', 'res_dist', 'res_angle')
ORTHOGONAL_TOL = 1e-4  # the largest |H_res^T H_res - I| at which H_res counts as orthogonal (float32 rounding)


def mixing(module, x):
    """H_res of a wide sublayer (module.coefficients) on its stream x (..., n, d), per token: (tokens, n, n) in
    float64 (the identity where the rule never mixes); None where the rule keeps one stream. The sublayer writes
    H_j <- sum_i H_res[j, i] H_i (HyperConnection.forward: combine(mixing.mT, H)), x_{l+1} = H_res x_l: a row
    gives one copy's new value, a column where one copy's value goes."""
    coefficients = module.coefficients(wide(x))
    if coefficients is None:
        return None
    res, n = coefficients[2], x.shape[-2]
    res = torch.eye(n, dtype=torch.float64, device=x.device) if res is None else res.double()
    return res.expand(*x.shape[:-2], n, n).reshape(-1, n, n)  # a static rule's one H_res, for every token


def mixing_stats(module, x):
    """H_res of an mHC sublayer (mixing) on its stream x (..., n, d), as three means over the tokens (float32, (3,)):

        res_offdiag  the off-diagonal mass, mean over rows i of 1 - H_res[i, i]: for a doubly stochastic H_res the
                     share of each copy's new value taken from the other copies (0 for I, 1 - 1/n for J/n); for
                     an orthogonal one (n - tr H_res) / n = (2/n) sum_k (1 - cos theta_k), theta_k as below;
        res_dist     ||H_res - I||_F, the Frobenius norm;
        res_angle    for an orthogonal H_res (every token's within ORTHOGONAL_TOL, as the Cayley map and the identity
                     give), the angle of its rotation: the largest angle between a vector v of R^n and H_res v,
                     max_k theta_k in [0, pi], theta_k = |arg lambda_k| over H_res's eigenvalues lambda_k =
                     e^(+-i theta_k); NaN where H_res is not orthogonal.

    HC's A_r likewise (not constrained, so 1 - A_r[i, i] is no share: a measure of how far A_r left I); NaN for all
    three where the rule keeps one stream."""
    res = mixing(module, x)
    if res is None:
        return torch.full((3,), math.nan, device=x.device)
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
    tangential update relative to what it read; then mixing_stats. One forward pass on idx (B, T), in the model's
    current mode; returns a (2L, 8) float32 device tensor, rows in layer order."""
    rows, reads = [None] * (2 * len(model.blocks)), [None] * (2 * len(model.blocks))

    def read(l, module, args):
        reads[l] = args[0]

    def measure(l, module, args):
        x, u = reads[l].float(), args[1].float()
        xx, uu, xu = (x * x).sum(-1), (u * u).sum(-1), (x * u).sum(-1)  # (B, T)
        par = xu * xu / xx
        perp = (uu - par).clamp_min(0)
        theta = (perp / xx).sqrt()
        stream = torch.stack([xx.mean(), par.mean(), perp.mean(), (xu / (xx * uu).sqrt()).mean(), theta.mean()])
        rows[l] = torch.cat([stream, mixing_stats(module, args[0])])
    norms = [n for b in model.blocks for n in (b.ln_1, b.ln_2)]
    with hooked(*hooks(norms, read), *hooks(rules(model), measure)):
        model(idx)
    return torch.stack(rows)


def stats_record(iter_num, model, rows, names):
    """The JSON-ready form of per-update rows (2L, len(names)): {'iter', 'attn': {name: [per block]}, 'mlp': {...}},
    None for NaN."""
    record = {'iter': iter_num, 'attn': {s: [] for s in names}, 'mlp': {s: [] for s in names}}
    for (_, sub, _), row in zip(updates(model), rows.tolist()):
        for s, v in zip(names, row):
            record[sub][s].append(None if math.isnan(v) else v)
    return record


# ----------------------------------------------------------------------------- gains across depth

MIXING_GAINS = tuple(f'{of}_{way}_{size}' for of in ('mix', 'comp') for way in ('fwd', 'bwd')
                     for size in ('max', 'min', 'log', 'norm'))


@contextmanager
def mixings(model):
    """Yields a list that a forward fills with each sublayer's H_res on its stream (mixing), in layer order."""
    found = [None] * (2 * len(model.blocks))

    def keep(l, module, args):
        found[l] = mixing(module, args[0])
    with hooked(*hooks(rules(model), keep)):
        yield found


def sum_gains(m):
    """The gains of per-token matrices m (tokens, n, n) applied as x <- m x, as [mHC] Sec. 3.1's Amax Gain Magnitude
    reads them: forward from the row sums s_i = sum_j m[i, j] (the factor by which copy i carries a signal common to
    all copies), backward from the column sums (the same for a gradient). For each: the largest and the smallest
    |s_i|, means over the tokens, the largest |log |s_i|| over the rows and the tokens, which a maximum alone would
    not show for an attenuation, and the other reading of "absolute row sum", max_i sum_j |m[i, j]| (the induced
    infinity-norm; the 1-norm backward), the same for a nonnegative m, larger where a row's signs cancel: (8,)
    float64."""
    gains = []
    for way in (-1, -2):
        size = m.sum(way).abs()
        gains += [size.amax(-1).mean(), size.amin(-1).mean(), size.log().abs().max(), m.abs().sum(way).amax(-1).mean()]
    return torch.stack(gains)


def mixing_gains(found):
    """(2L, 16) float64 CPU, MIXING_GAINS: sum_gains of each sublayer's H_res ('mix') and of the composite
    H_res(last) ... H_res(l + 1) H_res(l) ('comp'), which carries the copies entering sublayer l to those after the
    last, per token ([mHC] Fig. 3 (a) and (b)); NaN for a rule of one stream."""
    if found[0] is None:
        return torch.full((len(found), len(MIXING_GAINS)), math.nan, dtype=torch.float64)
    composite, rows = None, []
    for res in reversed(found):
        composite = res if composite is None else composite @ res
        rows.append(torch.cat([sum_gains(res), sum_gains(composite)]))
    return torch.stack(rows[::-1]).cpu()


def stream_site(model, l, replace):
    """A hook that hands sublayer l replace(x_l) in place of x_l, the stream it receives from the sublayers before
    it: what its rule prepares from (block l // 2's input, or its attention update's output; n copies for a wide
    rule), the Depth record's entries as they are (the embeddings and block outputs DenseFormer averages, x0_mix's
    anchor). Attention Residuals pass on no stream that anything reads: theirs is the newest source, the branch
    output of sublayer l - 1, or at l = 0 the embeddings."""
    block = model.blocks[l // 2]
    if isinstance(block.update_attn, AttentionResidual):
        if l == 0:
            return model.ln_emb.register_forward_hook(lambda m, args, out: replace(out))
        return rules(model)[l - 1].register_forward_pre_hook(lambda m, args: (args[0], replace(args[1]), *args[2:]))
    if l % 2 == 0:
        return block.register_forward_pre_hook(lambda m, args: (replace(args[0]), *args[1:]))
    return block.update_attn.register_forward_hook(lambda m, args, out: replace(out))


def stream_end(model, keep):
    """A hook that hands keep(x_end), the stream after the last sublayer: what the final norm reads (a depth rule's
    read of the output), for a wide rule the n copies before their mean."""
    if model.read_out is not None:
        return model.ln_f.register_forward_pre_hook(lambda m, args: keep(args[0]))
    return model.blocks[-1].register_forward_hook(lambda m, args, out: keep(out))


def start(x):
    """The power iteration's first direction: Gaussian, from a generator of its own (seed 0), so that measuring
    draws nothing from the run's generators."""
    return torch.randn(x.shape, generator=torch.Generator(x.device).manual_seed(0), dtype=x.dtype, device=x.device)


@torch.enable_grad()
def jtj(model, idx, l, v=None):
    """One step of the power iteration on J^T J, J = d x_end / d x_l (stream_site, stream_end) on idx: a forward
    with the tangent v at x_l (start(x_l) if None), whose forward-mode derivative at x_end is J v, then the backward
    of <x_end, J v> to x_l, J^T J v. Returns (v, J v, J^T J v)."""
    seen = {}

    def perturb(x):
        seen['x'] = x.detach().clone().requires_grad_()
        seen['v'] = start(x) if v is None else v
        return fwAD.make_dual(seen['x'], seen['v'])
    with fwAD.dual_level(), hooked(stream_site(model, l, perturb), stream_end(model, lambda y: seen.update(y=y))):
        model(idx)
        y, jv = fwAD.unpack_dual(seen['y'])
    return seen['v'], jv, torch.autograd.grad(y, seen['x'], jv)[0]  # past the dual level: no tangents in backward


def stream_gain(model, idx, l, iters, tol):
    """(sigma, rms) of J = d x_end / d x_l, float64. sigma: the square root of the largest Ritz value of J^T J on a
    Krylov space from start (Lanczos, each new direction orthogonalised against the earlier ones: as many passes as
    the power iteration, closer to the answer), a lower bound of J's largest singular value (J^T's alike), grown
    until a step raises the largest Ritz value (sigma^2) by at most tol of itself, or for `iters` steps. rms = ||J v_0||
    / ||v_0|| at the Gaussian start: the root mean square of J's singular values s, a typical direction's gain,
    attenuation included, where sigma is the worst; exact for equal s, and otherwise off by about c / sqrt(2
    x_l.numel()) of itself, c the coefficient of variation of s^2."""
    v, jv, w = jtj(model, idx, l)
    rms, basis, images = jv.norm() / v.norm(), [v.flatten() / v.norm()], [w.flatten() / v.norm()]
    top = [basis[0] @ images[0]]
    for _ in range(iters - 1):
        r = images[-1]
        for _ in range(2):  # Gram-Schmidt twice: orthogonal to rounding
            Q = torch.stack(basis)
            r = r - Q.T @ (Q @ r)
        if r.norm() <= 1e-6 * images[-1].norm():  # the space holds J^T J's image: its Ritz values are exact
            break
        basis.append(r / r.norm())
        images.append(jtj(model, idx, l, basis[-1].view_as(v))[2].flatten())
        top.append(torch.linalg.eigvalsh(torch.stack(basis).double() @ torch.stack(images).double().T)[-1])
        if top[-1] - top[-2] <= tol * top[-1]:
            break
    return torch.stack([top[-1].double().sqrt(), rms.double()])


@contextmanager
def own_pytorch(model):
    """The wide rules' two passes in their own PyTorch, as the model defines them, in place of the fused kernels
    (hc_kernels), whose ops have a backward formula and none for forward-mode AD, and without hc_recompute, whose
    checkpoint recomputes without the tangents it saw: the same function (tests/kernels/test_hc_kernels.py), as fast."""
    kept = {m: (m.kernels, m.recompute) for m in model.modules() if hasattr(m, 'kernels')}
    try:
        for m in kept:
            m.kernels, m.recompute = 'torch', False
        yield
    finally:
        for m, (kernels, recompute) in kept.items():
            m.kernels, m.recompute = kernels, recompute


LANCZOS_STEPS, LANCZOS_TOL = 30, 1e-4  # at most, and the rise at which a step stops it: docs/rules.md's measurements


def stream_gains(model, idx, iters=LANCZOS_STEPS, tol=LANCZOS_TOL):
    """(2L, 2) float64 CPU: stream_gain of every sublayer on idx, in the rules' own PyTorch and SDPA's math kernel,
    which forward-mode AD differentiates. Costs 2L x (at most) iters forwards with a tangent, and as many backwards."""
    with sdpa_kernel(SDPBackend.MATH), own_pytorch(model):
        return torch.stack([stream_gain(model, idx, l, iters, tol)
                            for l in range(2 * len(model.blocks))]).detach().cpu()  # numbers, not a graph


@torch.enable_grad()
def magnitudes(model, idx, targets):
    """(2L, 3) float64 CPU: per update, the mean per-token norms of its output x^(l), of d loss / d x^(l) and of
    d loss / d u^(l) (residual_grads; NaN where none reaches), from one forward and backward of the loss on (idx,
    targets). The backward runs to the stream entering block 0 alone: no parameter's .grad changes."""
    outs, first = [None] * (2 * len(model.blocks)), []

    def output(l, module, args, out):
        outs[l] = token_norm(out.detach())
    with residual_grads(model) as grads, residual_grads(model, branch=True) as branch_grads, \
            hooked(*hooks(rules(model), output, after=True),
                   *hooks(model.blocks[:1], lambda l, m, args: first.append(args[0]))):
        torch.autograd.grad(model(idx, targets)[1], first)
    return torch.tensor([[math.nan if v is None else float(v) for v in row] for row in zip(outs, grads, branch_grads)],
                        dtype=torch.float64)


# ----------------------------------------------------------------------------- what the depth rules weigh

BETA_BINS = 20  # DDL's beta over [0, 2] in bins of 0.1: "near" 0, 1 or 2 is within 0.1 (bin 0; bins 9, 10; bin 19)


def ddl_beta(module, x):
    """DDL's beta = 2 sigmoid(w_beta . RMSNorm(x) + b) per token, (...,) ([DDL] App. A.1; DeltaUpdate.forward)."""
    xf = wide(x)
    return 2 * torch.sigmoid(dot(F.rms_norm(xf, xf.shape[-1:]), module.w_beta) + module.b_beta)[..., 0]


def read_weights(module, depth):
    """Attention Residuals' weights over the sources of `depth` as module reads them, softmax_i(w . RMSNorm(v_i))
    ([AttnRes] Eq. 2-4), means over the tokens: (sources,), the embeddings first."""
    return module.weights(depth)[0].flatten(1).mean(1)[depth.sources()[1]]  # not the zeros of a fixed-length Depth


@contextmanager
def depth_pictures(model):
    """Yields a dict that a forward fills with what the rules that look across depth weigh, where the model has
    them: 'attnres_weights', per sublayer and last the read of the output, read_weights (alpha_{i->l});
    'ddl_beta', per sublayer the fraction of the tokens whose beta falls in each of BETA_BINS bins over [0, 2];
    'denseformer_alpha', per block its weights over the embeddings and the blocks' outputs so far."""
    found, depth = {}, []

    def weigh(l, module, args):
        if isinstance(module, AttentionResidual):
            depth[:] = [args[2].depth]  # forward(x, u, sub)
            found.setdefault('attnres_weights', []).append(read_weights(module, depth[0]))
        elif isinstance(module, DeltaUpdate):
            beta = ddl_beta(module, args[0]).float().flatten()
            found.setdefault('ddl_beta', []).append(torch.histc(beta, BETA_BINS, 0, 2) / beta.numel())
    with hooked(*hooks(rules(model), weigh)):
        yield found
    if depth:  # the read of the output, from what the last sublayer left
        found['attnres_weights'].append(read_weights(model.read_out, depth[0]))
    alpha = [m.alpha for m in rules(model) if isinstance(m, DenseFormerUpdate) and m.alpha is not None]
    found.update({'denseformer_alpha': alpha} if alpha else {})
    found.update({key: [t.tolist() for t in values] for key, values in found.items()})


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
    with hooked(model.ln_f.register_forward_hook(lambda m, i, o: out.append(o))):
        model(idx)
    return out[0]


def in_eval_mode(measure):
    """measure(model, ...) run in eval mode (no dropout; stochastic connections at their expected
    update, so no random number is drawn), the model back in the mode it was given in after."""
    def measured(model, *args):
        was = model.training
        model.eval()
        try:
            return measure(model, *args)
        finally:
            model.train(was)
    return measured


SEQUENCES = 1  # the batch's first sequences (images) on which the gradients and the Jacobians are measured
DEPTH_STATS = ('out_norm', 'out_grad', 'branch_grad', 'map_max', 'map_rms') + MIXING_GAINS


@in_eval_mode
def dynamics_record(model, idx, iter_num, targets=None, gains=True):
    """The JSON record of dynamics.jsonl: update_stats of one forward on idx, and in the same forward each
    sublayer's H_res (mixing_gains) and depth_pictures; on idx's first SEQUENCES sequences magnitudes (given the
    targets) and, where `gains`, stream_gains (most of a record's cost): per sublayer STATS + DEPTH_STATS in 'attn'
    and 'mlp' (None where not measured), and the pictures beside."""
    with mixings(model) as found, depth_pictures(model) as pictures:
        stats = update_stats(model, idx)
    few, unmeasured = idx[:SEQUENCES], lambda k: torch.full((len(found), k), math.nan, dtype=torch.float64)
    grads = magnitudes(model, few, targets[:SEQUENCES]) if targets is not None else unmeasured(3)
    rows = torch.cat([stats.double().cpu(), grads, stream_gains(model, few) if gains else unmeasured(2),
                      mixing_gains(found)], 1)
    return {**stats_record(iter_num, model, rows, STATS + DEPTH_STATS), **pictures}


@in_eval_mode
def final_rank(model, idx):
    """The effective rank of the representation the head reads (Oh et al., App. D)."""
    return effective_rank(final_features(model, idx))
