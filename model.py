"""OrthoGPT model: transformer blocks whose residual update is pluggable.

Read top to bottom:
  1. configs            BlockConfig (what a Block needs), GPTConfig
  2. residual updates   forward(x, u) -> x_next; additive, orthogonal, rotation
  3. orthogonal Q/K/V   the Cayley and exp maps of O-ViT, as torch parametrizations
  4. Block              norm -> attention -> update, norm -> MLP -> update
  5. Trunk              embedding norm -> blocks -> final norm, shared by both models
  6. GPT                token + position embeddings, trunk (causal), LM head; cached decoding
  7. ViT                patches + [CLS] + positions, trunk (not causal), class head

The papers are in ../shared/papers/ (see DESIGN.md):
  [Oh]  orthogonal-residual-update_oh2025.txt   (orthogonal update)
  [OT]  orthogonal-transformer-rotation.txt     (rotation update, sigma init)
  [OViT] o-vit-cayley-qkv_fei2022.txt           (Cayley / exp Q, K, V)
"""

import math
import platform
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.utils import parametrize


# ----------------------------------------------------------------------------- 1. configs

@dataclass
class BlockConfig:
    """Everything a Block needs; shared by every model built from Blocks."""
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = False  # bias in Linear layers and LayerNorm
    norm: Literal['layernorm', 'rmsnorm'] = 'layernorm'  # pre-norm type (unused by rotation)
    activation: Literal['gelu', 'relu'] = 'gelu'
    residual: Literal['additive', 'orthogonal', 'rotation'] = 'additive'
    ortho_mode: Literal['feature', 'global'] = 'feature'  # [Oh] Alg. 1 / Alg. 2
    ortho_eps: float = 1e-6  # [Oh] Eq. 3, Sec. 4.6
    ortho_prob: float = 1.0  # [Oh] Sec. 4.4: probability that a connection is orthogonal
    ortho_layers: tuple[int, ...] | None = None  # [Oh] Sec. 4.5: block indices; None = all
    qkv: Literal['dense', 'cayley', 'exp'] = 'dense'  # [OViT] Sec. 3
    init: Literal['gpt2', 'sigma'] = 'gpt2'  # 'sigma': [OT] "Experiments"
    sigma_w: float = 0.5  # 'sigma' init: std of V, out-proj and MLP weights is sigma_w/sqrt(d)
    sigma_qk: float = 1.0  # 'sigma' init: std of Q and K weights is sigma_qk/sqrt(d)

    def __post_init__(self):
        for key in ('n_layer', 'n_head', 'n_embd'):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be at least 1")
        for key in ('ortho_eps', 'sigma_w', 'sigma_qk'):
            if not getattr(self, key) >= 0:
                raise ValueError(f"{key}={getattr(self, key)} must not be negative")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                             f"choose n_head among {[h for h in range(1, 17) if self.n_embd % h == 0]}")
        if not 0.0 <= self.ortho_prob <= 1.0:
            raise ValueError(f"ortho_prob={self.ortho_prob} must lie in [0, 1]")
        if self.ortho_layers is not None:
            bad = [i for i in self.ortho_layers if not 0 <= i < self.n_layer]
            if bad:
                raise ValueError(f"ortho_layers {bad} out of range for n_layer={self.n_layer} "
                                 f"(valid block indices: 0..{self.n_layer - 1})")


@dataclass
class ViTConfig(BlockConfig):
    image_size: int = 32
    patch_size: int = 4
    channels: int = 3
    n_classes: int = 10
    label_smoothing: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size={self.image_size} is not a multiple of patch_size={self.patch_size}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing={self.label_smoothing} must lie in [0, 1)")


@dataclass
class GPTConfig(BlockConfig):
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64
    tie_weights: bool = True  # share wte and lm_head (GPT-2)

    def __post_init__(self):
        super().__post_init__()
        if self.init == 'sigma' and self.tie_weights:
            raise ValueError("init='sigma' needs tie_weights=False: its unit-variance token embeddings "
                             "would make a tied output head emit logits of std ~sqrt(n_embd)")


# ----------------------------------------------------------------------------- 2. residual updates

class ResidualUpdate(nn.Module):
    """Interface of every update rule: forward(x, u, cache=None) -> x_next.

    x is the residual stream, u the branch output (attention or MLP), both (..., d).
    keeps_norm = True declares that the rule keeps ||x|| fixed; the model then needs
    no norms in its blocks (see GPT). cache is the DecodeCache of incremental decoding; only a
    rule that mixes positions needs it, per-token rules ignore it.
    """
    keeps_norm = False


class AdditiveUpdate(ResidualUpdate):
    """x_next = x + u: the standard residual connection ([OT] Eq. 2)."""

    def forward(self, x, u, cache=None):
        return x + u


def wide(t):
    """t in float32, or float64 if it is: the update rules' working precision. (On a CPU each
    call into PyTorch costs microseconds, as much as a pass over a (12, 64, 128) tensor, so
    the rules skip the conversions they do not need.)"""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def back_to(t, dtype):
    """t back in the caller's dtype: the inverse of wide."""
    return t if t.dtype == dtype else t.to(dtype)


def dot(a, b):
    """<a, b> over the last dimension, kept as a dimension of size 1: (..., d) -> (..., 1)."""
    return (a * b).sum(-1, keepdim=True)


def sq(a):
    """||a||^2 over the last dimension, (..., 1): one pass over a where dot(a, a) takes two."""
    return torch.linalg.vector_norm(a, dim=-1, keepdim=True).square()


class OrthogonalUpdate(ResidualUpdate):
    """x_next = x + u - s x,  s = <x, u> / (||x||^2 + eps)          [Oh] Sec. 3.2, Eq. 3-4.

    u - s x is the part of u orthogonal to x (up to eps); computed in float32 ([Oh] App. F), or
    float64 for float64 inputs.
    mode='feature' ([Oh] Alg. 1): one s per token, over the hidden dimension.
    mode='global'  ([Oh] Alg. 2): one s per sample, over all tokens and features, x of shape
      (B, T, d). A plain global s in a causal model would let position t see positions > t, so
      with causal=True s_t uses prefix sums over positions <= t (at t = T-1 it is the paper's s);
      in decoding the cache holds the earlier positions' terms, so the sums stay exact.
    prob ([Oh] Sec. 4.4): in training each sample's connection is orthogonal with probability
      prob and additive otherwise (drawn per sample, per connection, per step, like drop-path);
      in eval the expected update x + u - prob s x is used, as dropout rescales.
    """

    def __init__(self, mode='feature', eps=1e-6, prob=1.0, causal=False):
        super().__init__()
        if mode not in ('feature', 'global'):
            raise ValueError(f"unknown ortho_mode {mode!r}; use 'feature' or 'global'")
        self.mode, self.eps, self.prob, self.causal = mode, eps, prob, causal

    def scale(self, x, u, cache=None):
        """s in float32 (float64 for float64 inputs), broadcastable against x."""
        if self.mode == 'global' and x.dim() != 3:
            raise ValueError(f"global orthogonal mode takes (B, T, d) tensors, got shape {tuple(x.shape)}")
        x, u = wide(x), wide(u)
        xu, xx = dot(x, u), sq(x)  # (B, T, 1)
        if self.mode == 'global':
            if self.causal:
                T = xu.shape[-2]
                if cache is not None:
                    xu, xx = cache.extend(self, xu, xx, dim=-2)  # (B, T_seen, 1)
                xu, xx = xu.cumsum(-2)[:, -T:], xx.cumsum(-2)[:, -T:]
            else:
                xu, xx = xu.sum(-2, keepdim=True), xx.sum(-2, keepdim=True)  # (B, 1, 1)
        return xu / (xx + self.eps)

    def forward(self, x, u, cache=None):
        m = 1.0  # multiplies s: the connection's probability of being orthogonal, or its draw
        if self.prob < 1.0:
            m = (torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), device=x.device) < self.prob).float() \
                if self.training else self.prob
        if self.mode == 'feature':
            return written_out(_OrthogonalFeature, orthogonal_feature, x, u, self.eps, m)
        s = self.scale(x, u, cache) * m
        return torch.addcmul(wide(u), wide(x), 1 - s).to(x.dtype)  # x (1 - s) + u

    def extra_repr(self):
        return f"mode={self.mode}, eps={self.eps}, prob={self.prob}, causal={self.causal}"


def written_out(function, value, x, u, *args):
    """An update rule with a written-out gradient: function.apply where autograd will
    differentiate through it, else value's output alone (the autograd.Function's call costs
    about 35 us, a third of a decoding step's rule)."""
    if torch.is_grad_enabled() and (x.requires_grad or u.requires_grad):
        return function.apply(x, u, *args)
    return value(x, u, *args)[0]


def orthogonal_feature(x, u, eps, m):
    """The feature-wise orthogonal update, and the per-token terms its gradient reuses."""
    xf, uf = wide(x), wide(u)
    n = sq(xf).add_(eps)
    q = m / n
    s = dot(xf, uf).mul_(q)
    return back_to(torch.addcmul(uf, xf, 1 - s), x.dtype), (n, q, s)


class _OrthogonalFeature(torch.autograd.Function):
    """The feature-wise OrthogonalUpdate and its gradient, in its working precision: with
    n = ||x||^2 + eps, q = m / n and s = q <x, u>, the output is u + (1 - s) x, and from its
    gradient g, with gx = <g, x>:
        grad_u = g - gx q x,   grad_x = (1 - s) g - gx q u + (2 gx s / n) x.
    Written out because autograd's takes about twice as many passes over (B, T, d) tensors,
    which on a CPU cost more than the arithmetic (docs/performance.md)."""

    @staticmethod
    def forward(ctx, x, u, eps, m):
        out, terms = orthogonal_feature(x, u, eps, m)
        ctx.save_for_backward(x, u, *terms)
        return out

    @staticmethod
    @once_differentiable  # the saved per-token terms are constants here: no second derivative
    def backward(ctx, g):
        x, u, n, q, s = ctx.saved_tensors
        xf, uf, g = wide(x), wide(u), wide(g)
        gx = dot(g, xf)
        gq = gx * q
        grad_u = torch.addcmul(g, xf, gq, value=-1)
        grad_x = torch.addcmul(g, g, s, value=-1).addcmul_(uf, gq, value=-1).addcmul_(xf, (gx * s).div_(n), value=2)
        return back_to(grad_x, x.dtype), back_to(grad_u, u.dtype), None, None


class RotationUpdate(ResidualUpdate):
    """Rotate x in the plane of (x, u): the Orthogonal Transformer ([OT] "Implementation").

        u_perp = u - (<x, u> / ||x||^2) x,   theta = ||u_perp|| / sqrt(d),
        x_next = x cos(theta) + u_perp sin(theta) / theta                    ([OT] Eq. 8)

    i.e. exp(B) x for the bivector of x and u ([OT] Eq. 4-7; Eq. 7 turns x towards u, so acting on
    column vectors B = u_perp x^T - x u_perp^T, up to normalisation). It keeps ||x_next|| = ||x||
    on the sphere of radius sqrt(d), where the model keeps every block input. Computed in
    float32 (float64 for float64 inputs). The paper swaps in x + u_perp below a threshold to
    avoid 0/0; we evaluate cos and sin/theta by their Taylor series for theta < 1e-2 instead
    (selected with torch.where, no Python branch, no host sync). There the series equal the
    functions to float32 rounding, so the rule is the same, tends to x + u_perp as theta -> 0,
    keeps the norm exact, and its gradient is finite at u_perp = 0. The gradient is written out
    (_Rotate): autograd's would take some 30 elementwise passes over (B, T, d) tensors, which on
    a CPU cost more than the rest of the rule (docs/performance.md).
    """
    keeps_norm = True
    small_angle = 1e-2

    def forward(self, x, u, cache=None):
        return written_out(_Rotate, rotation, x, u, self.small_angle)


def rotation(x, u, small_angle):
    """RotationUpdate's value, and the per-token terms its gradient reuses."""
    xf, uf = wide(x), wide(u)
    xx = sq(xf)
    a = dot(xf, uf).div_(xx)
    p = torch.addcmul(uf, xf, a, value=-1)  # u_perp
    t = sq(p).div_(x.shape[-1])  # theta^2, (..., 1)
    small = t < small_angle ** 2
    theta = t.clamp_min(small_angle ** 2).sqrt_()  # safe where unused
    c = torch.where(small, torch.rsub(t, 1, alpha=1 / 2), theta.cos())
    sg = torch.where(small, torch.rsub(t, 1, alpha=1 / 6), theta.sin().div_(theta))
    return back_to(torch.addcmul(xf * c, p, sg), x.dtype), (xx, a, t, c, sg, small)


class _Rotate(torch.autograd.Function):
    """RotationUpdate's value and its gradient, in its working precision.

    With a = <x, u> / ||x||^2, p = u - a x, t = theta^2 = ||p||^2 / d, c = cos(theta) and
    sg = sin(theta) / theta, the output is c x + sg p. Back from its gradient g: t receives
    gt = <g, x> dc/dt + <g, p> dsg/dt (dc/dt = -sg/2, dsg/dt = (c - sg) / 2t; -1/2 and -1/6 for
    the series), p receives gp = sg g + (2 gt / d) p, and through p = u - a x, with
    k = <gp, x> / ||x||^2 = sg <g, x> / ||x||^2 (as <p, x> = 0):
        grad_u = gp - k x,   grad_x = c g - a gp - k (u - 2 a x),
    each gathered into three passes over g, u and x."""

    @staticmethod
    def forward(ctx, x, u, small_angle):
        out, terms = rotation(x, u, small_angle)
        ctx.save_for_backward(x, u, *terms)
        return out

    @staticmethod
    @once_differentiable  # the saved per-token terms are constants here: no second derivative
    def backward(ctx, g):
        x, u, xx, a, t, c, sg, small = ctx.saved_tensors
        xf, uf, g = wide(x), wide(u), wide(g)
        gx_dot = dot(g, xf)
        gp_dot = torch.addcmul(dot(g, uf), a, gx_dot, value=-1)  # <g, p>
        dc2 = torch.where(small, -1.0, sg.neg())  # 2 dc/dt
        dsg2 = torch.where(small, -1 / 3, torch.sub(c, sg).div_(t))  # 2 dsg/dt
        beta = torch.addcmul(gx_dot * dc2, gp_dot, dsg2).div_(x.shape[-1])  # gp = sg g + beta p, p = u - a x
        k = (sg * gx_dot).div_(xx)
        ab_k = torch.addcmul(k, a, beta)
        grad_u = torch.mul(g, sg).addcmul_(uf, beta).addcmul_(xf, ab_k, value=-1)
        grad_x = torch.mul(g, torch.addcmul(c, a, sg, value=-1)).addcmul_(uf, ab_k, value=-1) \
            .addcmul_(xf, (ab_k + k).mul_(a))
        return back_to(grad_x, x.dtype), back_to(grad_u, u.dtype), None


RESIDUALS = {'additive': AdditiveUpdate, 'orthogonal': OrthogonalUpdate, 'rotation': RotationUpdate}


def make_update(cfg, layer, causal):
    """The update rule of block `layer`: ortho_layers / ortho_prob=0 leave a block additive."""
    if cfg.residual == 'orthogonal':
        if cfg.ortho_prob == 0 or (cfg.ortho_layers is not None and layer not in cfg.ortho_layers):
            return AdditiveUpdate()
        return OrthogonalUpdate(cfg.ortho_mode, cfg.ortho_eps, cfg.ortho_prob, causal)
    return RESIDUALS[cfg.residual]()


# ----------------------------------------------------------------------------- 3. orthogonal Q/K/V

class OrthogonalQKV(nn.Module):
    """Maps a raw (3d, d) weight to three stacked orthogonal d x d matrices ([OViT] Alg. 1-2).

    Per matrix: A = W - W^T (skew-symmetric, [OViT] Alg. 2 line 1), then
      cayley: h(A) = 2 (I + A)^-1 - I = (I + A)^-1 (I - A)   ([OViT] Eq. 11), via one inverse
              (_Cayley, `inverse`): I + A is invertible for skew A, so inv_ex skips the error
              check (no host sync), and the backward is two matrix products where a solve's
              would be another solve (on CPU at d=128 this cut the map's forward + backward
              from 2.6 to 2.0 ms);
      exp:    exp(A), the matrix exponential ([OViT] Sec. 3.2, the Exp-ViT comparison).
    The three maps run as one batched float32 call per forward, autocast off (training,
    evaluation and generation batch every layer's maps in one call: maps_once_per_step,
    maps_held); train.py leaves TF32 off unless the whole run is float32 on CUDA, where the exp
    map's products then carry TF32 rounding. On CPU the exp map's backward is costly (about 8x
    Cayley's at d=128).

    Registered with torch.nn.utils.parametrize, so `c_attn.weight` is the orthogonal stack, the
    optimizer sees the raw W (O-ViT Sec. 3.3: plain Adam on Euclidean W). We do not use
    torch.nn.utils.parametrizations.orthogonal: its Cayley map is (I - A'/2)^-1 (I + A'/2) = h(-A'/2)
    with A' built from the lower triangle of W, and by default it is left-multiplied by a fixed
    orthogonal `base` (dynamic trivialization). That reaches the same matrices through other
    coordinates, hence other gradient steps; this class keeps the paper's.
    """

    def __init__(self, kind):
        super().__init__()
        if kind not in ('cayley', 'exp'):
            raise ValueError(f"unknown orthogonal map {kind!r}; use 'cayley' or 'exp'")
        self.kind = kind
        self.held = None  # the value to return, set for a whole step (maps_once_per_step, maps_held)

    def forward(self, w):  # w: (3d, d), or a stack of them (..., 3d, d)
        if self.held is not None:
            return self.held
        d = w.shape[-1]
        with torch.autocast(w.device.type, enabled=False):
            w32 = w.float().view(-1, d, d)  # (3 x layers, d, d)
            q = _Cayley.apply(w32) if self.kind == 'cayley' else torch.linalg.matrix_exp(w32 - w32.mT)
        return q.reshape(w.shape).to(w.dtype)

    def extra_repr(self):
        return self.kind


def mkl_untuned(cpuinfo='/proc/cpuinfo'):
    """Whether torch's LAPACK is MKL on a CPU that MKL does not tune for: MKL picks its kernels by
    CPU vendor and runs generic code on AMD and Hygon CPUs, where LAPACK's small inverses take
    2-3x as long as on its tuned path (docs/performance.md)."""
    if not torch.backends.mkl.is_available():
        return False
    try:
        with open(cpuinfo) as f:
            info = f.read(4096)
    except OSError:
        info = platform.processor()  # Windows: 'AMD64 Family 25 Model 33 Stepping 0, AuthenticAMD'
    return 'AuthenticAMD' in info or 'HygonGenuine' in info


MKL_UNTUNED = mkl_untuned()  # where `inverse` goes by blocks and `Linear` multiplies a single row by dot products
BLOCK_LEAF = 32  # where `inverse`'s blocks stop: of 16, 32 and 64 the fastest here (docs/performance.md)
INVERSE_LEAF = BLOCK_LEAF if MKL_UNTUNED else 0  # `inverse` goes by blocks only where they pay


def inverse(m, leaf=None):
    """m^-1 of a stack (n, d, d) of matrices whose symmetric part is positive definite, as
    I + A is for skew A; row-major, like m. One batched LAPACK inverse, or on a CPU, with a leaf
    size (leaf=None: INVERSE_LEAF; 0: none), blocks first:
        [[P, B], [C, E]]^-1 = [[P^-1 + X S^-1 Y, -X S^-1], [-S^-1 Y, S^-1]],
        X = P^-1 B, Y = C P^-1, S = E - C P^-1 B,
    recursively down to leaf x leaf blocks. P and S inherit the positive definite symmetric part,
    so they are invertible without pivoting. The blocks pay where MKL runs generic code
    (INVERSE_LEAF): on this project's AMD CPU, for 12 matrices of 128 x 128, LAPACK's inverse (a
    factorisation, then a solve against I four times as slow) takes 3.6 ms, the blocks 1.9 ms,
    with the same float32 error; with MKL on its Intel code path (emulated on the same CPU)
    LAPACK's takes 1.4 ms and the blocks 1.8 (`bench.py --rules`, docs/performance.md)."""
    d, leaf = m.shape[-1], INVERSE_LEAF if leaf is None else leaf
    if not leaf or m.device.type != 'cpu' or d <= leaf:
        return torch.linalg.inv_ex(m.mT)[0].mT  # LAPACK is column-major: m.mT is m^T without a copy
    h = d // 2
    p, b, c, e = m[..., :h, :h], m[..., :h, h:], m[..., h:, :h], m[..., h:, h:]
    p_inv = inverse(p, leaf)
    x = torch.bmm(p_inv, b)  # bmm takes the strided blocks as they are; `@` copied them first
    s_inv = inverse(torch.baddbmm(e, c, x, alpha=-1), leaf)
    y = torch.bmm(c, p_inv)
    out = m.new_empty(m.shape)
    x_s = torch.bmm(x, s_inv)
    out[..., :h, :h] = torch.baddbmm(p_inv, x_s, y)
    out[..., :h, h:] = x_s.neg_()
    out[..., h:, :h] = torch.bmm(s_inv, y).neg_()
    out[..., h:, h:] = s_inv
    return out


def identity_plus_skew(w):
    """I + A with A = W - W^T, for a stack (n, d, d): the matrix the Cayley map inverts."""
    m = w - w.mT
    m.diagonal(dim1=-2, dim2=-1).add_(1)
    return m


class _Cayley(torch.autograd.Function):
    """The Cayley map of (n, d, d) raw weights W, h = 2 M^-1 - I with M = I + W - W^T, and its
    gradient. From the gradient G of h, d(M^-1) = -M^-1 dM M^-1 gives
    dL/dM = -2 M^-T G M^-T =: -T, and through A = W - W^T, grad_W = T^T - T.
    Written out so that every pass stays in row-major order: autograd's version made more
    elementwise passes (the identity added and taken away, the 2, a negation) and returned LAPACK's
    column-major inverse, which the reshape to (3d, d) then copied with a transposing read (on
    this project's CPU, 4 layers' maps forward + backward: 6.1 ms before, 5.5 ms written out with
    the same LAPACK inverse, 3.9 ms with `inverse`'s blocks; docs/performance.md)."""

    @staticmethod
    def forward(ctx, w):
        inv = inverse(identity_plus_skew(w))
        ctx.save_for_backward(inv)
        h = inv * 2
        h.diagonal(dim1=-2, dim2=-1).sub_(1)
        return h

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        inv, = ctx.saved_tensors
        t = torch.baddbmm(g, inv.mT, g, beta=0, alpha=2).bmm(inv.mT)  # T, (n, d, d)
        return t.mT - t


class _AddGrad(torch.autograd.Function):
    """Identity whose backward adds `extra`: the gradient earlier micro-steps left on a held map."""

    @staticmethod
    def forward(ctx, x, extra):
        ctx.extra = extra
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad + ctx.extra, None


_MAPS = weakref.WeakKeyDictionary()  # model -> its orthogonal_maps: a module walk costs 0.2 ms a step on CPU


def orthogonal_maps(model):
    """(map, raw weight) of every orthogonal Q/K/V parametrization in model (set at construction)."""
    if model not in _MAPS:
        _MAPS[model] = [(m.parametrizations.weight[0], m.parametrizations.weight.original) for m in model.modules()
                        if parametrize.is_parametrized(m, 'weight')
                        and isinstance(m.parametrizations.weight[0], OrthogonalQKV)]
    return _MAPS[model]


def batched_maps(maps):
    """The value of each (map, raw weight) in maps, from one batched call per kind and shape:
    a d x d solve is mostly latency on a GPU, so 12 layers' maps cost about a sixth of 12 calls
    (H100, d=768: 18 ms against 111 ms forward + backward, docs/performance.md)."""
    groups = {}
    for p, w in maps:
        groups.setdefault((p.kind, w.shape, w.dtype, w.device), []).append((p, w))
    values = {}
    for group in groups.values():
        stacked = group[0][0](torch.stack([w for _, w in group]))  # (layers, 3d, d), one call
        values.update((p, q) for (p, _), q in zip(group, stacked.unbind(0)))
    return values


@contextmanager
def maps_once_per_step(model, micro_steps):
    """Orthogonal Q/K/V in training: every layer's map computed in one batched call (batched_maps),
    once per optimizer step, as the raw weights do not change between the micro-steps of one step.
    Yields before(micro_step), to call ahead of each micro-step's forward. With one micro-step
    the layers use the batched values directly. With more, until the last micro-step backward
    stops at a held copy of each value, a leaf where the gradients sum; the last backward runs
    through the batched maps once with their sum added, so the raw weights (and DDP's all-reduce
    hooks on them) get the whole step's gradient from one backward, as without the reuse."""
    maps = orthogonal_maps(model)
    values = {}

    def before(micro_step):
        if micro_step == 0:
            values.update(batched_maps(maps))
        for p, _ in maps:
            if micro_steps == 1:
                p.held = values[p]
            elif micro_step == 0:
                p.held = values[p].detach().requires_grad_()
            elif micro_step == micro_steps - 1:
                p.held = values[p] if p.held.grad is None else _AddGrad.apply(values[p], p.held.grad)
    try:
        yield before
    finally:
        for p, _ in maps:
            p.held = None


@contextmanager
def maps_held(model):
    """Inference (evaluation, generation): every orthogonal Q/K/V map computed once, in one
    batched call, and reused by every forward until exit. The weights must not change inside."""
    with maps_once_per_step(model, 1) as before:
        with torch.no_grad():
            before(0)
        yield


def raw_weight(linear):
    """The trainable weight of a Linear: the raw W under a parametrization, else .weight."""
    if parametrize.is_parametrized(linear, 'weight'):
        return linear.parametrizations.weight.original
    return linear.weight


# ----------------------------------------------------------------------------- 4. Block

class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension: nn.RMSNorm's function and
    parameter (eps None: machine epsilon of the working dtype), in float32 for narrower inputs.
    Ours because on a CPU PyTorch's rms_norm is a chain of elementwise kernels forward and
    backward: this form, one vector_norm pass, takes about 0.6x its time forward + backward at
    (12, 64, 128) (docs/performance.md); compiled, both fuse the same."""

    def __init__(self, d, eps=None, elementwise_affine=True):
        super().__init__()
        self.d, self.eps = d, eps
        self.weight = nn.Parameter(torch.ones(d)) if elementwise_affine else None

    def forward(self, x):  # (..., d)
        xf = wide(x)
        eps = torch.finfo(xf.dtype).eps if self.eps is None else self.eps
        r = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square().div_(self.d).add_(eps).rsqrt_()  # (..., 1)
        y = xf * r if self.weight is None else xf * r * self.weight
        return back_to(y, x.dtype)

    def extra_repr(self):
        return f"{self.d}, eps={self.eps}, elementwise_affine={self.weight is not None}"


def make_norm(cfg, keeps_norm):
    if keeps_norm:  # [OT] "Experiments": the stream is already on the sphere
        return nn.Identity()
    if cfg.norm == 'rmsnorm':
        return RMSNorm(cfg.n_embd)
    return nn.LayerNorm(cfg.n_embd, bias=cfg.bias)


ROW_DOTS = (1 << 17, 1 << 19)  # `Linear` takes dot products for weights of [2^17, 2^19) elements


class Linear(nn.Linear):
    """nn.Linear; where MKL runs generic code (MKL_UNTUNED), the product of a single row with a
    weight of ROW_DOTS size, as in each step of cached decoding, is one dot product per weight row.
    MKL's matrix-vector product there runs on one core; an elementwise product and a sum run on
    both, and below 2^19 elements their temporary stays in the two cores' L2 caches (2 MiB). One
    cached decoding step on this project's CPU took 25% less time for the 16 x 256 model, 11% less
    for 6 x 384. Dot products for every weight made the step of 4 x 128 (weights of 2^16 elements
    and less, in cache) 24% slower, and that of GPT-2 124M's blocks (6 x 10^5 elements and more)
    slower in four runs of five (docs/performance.md). Autocast keeps nn.Linear's product, whose
    dtype it sets. The size comes from the shape: a parametrized weight is computed once."""

    def forward(self, x):  # (..., in) -> (..., out)
        if (MKL_UNTUNED and x.device.type == 'cpu' and x.numel() == x.shape[-1]
                and ROW_DOTS[0] <= self.in_features * self.out_features < ROW_DOTS[1]
                and not torch.is_autocast_enabled('cpu')):
            y = torch.linalg.vecdot(self.weight, x.reshape(1, -1)).view(x.shape[:-1] + (-1,))
            return y if self.bias is None else y + self.bias
        return super().forward(x)


class SelfAttention(nn.Module):
    """Multi-head self-attention; `causal` is set by the model that builds the Block."""

    def __init__(self, cfg, causal):
        super().__init__()
        self.c_attn = Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        if cfg.qkv != 'dense':
            parametrize.register_parametrization(self.c_attn, 'weight', OrthogonalQKV(cfg.qkv))
        self.c_proj = Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.n_head, self.dropout, self.causal = cfg.n_head, cfg.dropout, causal

    def forward(self, x, cache=None):
        B, T, C = x.shape
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head)
        # unbind, then transpose: a permute of qkv has a backward that copies the whole gradient once
        # more (0.35 ms a step on the CPU recipe), and splitting it in three costs decoding more calls
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # (B, nh, T, hs)
        if cache is not None:
            k, v = cache.extend(self, k, v, dim=2)  # (B, nh, T_seen, hs)
        Tk = k.shape[2]
        mask, is_causal = None, False  # a single query sees every key
        if self.causal and T > 1:
            if T == Tk:
                is_causal = True
            else:  # queries at the end of the keys: SDPA's is_causal aligns them at the start instead
                mask = torch.ones(T, Tk, dtype=torch.bool, device=x.device).tril(Tk - T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=is_causal)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C), copied where T > 1
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.act = nn.ReLU() if cfg.activation == 'relu' else nn.GELU()
        self.c_proj = Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):  # (..., C)
        # flattened: compiled for a CPU, inductor saves the ReLU mask of a 3-D activation as a
        # bool tensor, whose stores and loads are slow there (2.5 ms per layer in a 50 ms step of
        # config/cpu.py, docs/performance.md); of a 2-D one it saves the output instead
        h = self.act(self.c_fc(x.flatten(0, -2)))  # (N, 4C)
        return self.dropout(self.c_proj(h)).view_as(x)


class Block(nn.Module):
    """x <- update(x, attn(norm(x))); x <- update(x, mlp(norm(x)))."""

    def __init__(self, cfg, layer, causal):
        super().__init__()
        keeps_norm = RESIDUALS[cfg.residual].keeps_norm
        self.ln_1 = make_norm(cfg, keeps_norm)
        self.attn = SelfAttention(cfg, causal)
        self.update_attn = make_update(cfg, layer, causal)
        self.ln_2 = make_norm(cfg, keeps_norm)
        self.mlp = MLP(cfg)
        self.update_mlp = make_update(cfg, layer, causal)

    def forward(self, x, cache=None):  # (B, T, C)
        x = self.update_attn(x, self.attn(self.ln_1(x), cache), cache=cache)
        x = self.update_mlp(x, self.mlp(self.ln_2(x)), cache=cache)
        return x

    @torch.no_grad()
    def init_weights(self, cfg):
        """'gpt2': N(0, 0.02), output projections N(0, 0.02/sqrt(2 n_layer)) (GPT-2 paper).
        'sigma' ([OT] "Experiments"): Q, K ~ N(0, sigma_qk^2/d); V, attention out-proj and the
        MLP's first matrix ~ N(0, sigma_w^2/d); the MLP's second ~ N(0, 2 sigma_w^2/(4d)), the 2
        compensating ReLU's halving of the variance. Under a Cayley/exp map this initialises
        the raw W the map reads."""
        d = cfg.n_embd
        for lin in (self.attn.c_attn, self.attn.c_proj, self.mlp.c_fc, self.mlp.c_proj):
            if lin.bias is not None:
                lin.bias.zero_()
        qkv = raw_weight(self.attn.c_attn)
        if cfg.init == 'gpt2':
            for w in (qkv, self.mlp.c_fc.weight):
                w.normal_(0.0, 0.02)
            for w in (self.attn.c_proj.weight, self.mlp.c_proj.weight):
                w.normal_(0.0, 0.02 / math.sqrt(2 * cfg.n_layer))
        else:
            qkv[:2 * d].normal_(0.0, cfg.sigma_qk / math.sqrt(d))
            qkv[2 * d:].normal_(0.0, cfg.sigma_w / math.sqrt(d))
            self.attn.c_proj.weight.normal_(0.0, cfg.sigma_w / math.sqrt(d))
            self.mlp.c_fc.weight.normal_(0.0, cfg.sigma_w / math.sqrt(d))
            self.mlp.c_proj.weight.normal_(0.0, cfg.sigma_w * math.sqrt(2 / (4 * d)))


# ----------------------------------------------------------------------------- 5. Trunk

class Trunk:
    """The stack both models share: ln_emb -> blocks -> ln_f. With a norm-keeping rule (rotation)
    it is the Orthogonal Transformer's ([OT] "Experiments"): one RMSNorm without weights after the
    embeddings, no norm inside the blocks and no final norm, so every block sees ||x|| = sqrt(d).
    A mixin, so each model registers these modules where its own parameters call for them."""

    def build_trunk(self, config, causal):
        keeps_norm = RESIDUALS[config.residual].keeps_norm
        # eps far below any embedding's mean square, so the norm is sqrt(d) to float32 rounding
        self.ln_emb = RMSNorm(config.n_embd, eps=1e-30, elementwise_affine=False) if keeps_norm else nn.Identity()
        self.blocks = nn.ModuleList([Block(config, i, causal) for i in range(config.n_layer)])
        self.ln_f = make_norm(config, keeps_norm)

    def trunk(self, x, cache=None):  # (B, T, C) embeddings -> (B, T, C) features for the head
        x = self.ln_emb(x)
        for block in self.blocks:
            x = block(x, cache)
        return self.ln_f(x)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())


# ----------------------------------------------------------------------------- 6. GPT

class DecodeCache:
    """What incremental decoding carries from one GPT.forward to the next, so that feeding a
    sequence in pieces gives the logits of one full forward: each attention's keys and values,
    and each causal global orthogonal update's per-position terms <x, u> and ||x||^2. Per-token
    rules (additive, feature orthogonal, rotation) keep nothing. `pos` counts positions seen.
    Buffers hold `capacity` positions from the start, so a step writes its own position only."""

    def __init__(self, capacity):
        self.pos, self.capacity, self.buffers = 0, capacity, {}

    def extend(self, module, *new, dim):
        """Store module's new tensors after the pos positions before them, along dim; returns
        views of all positions so far."""
        dim %= new[0].dim()
        key = id(module)  # not the module: torch.compile would guard on the model through the cache
        if key not in self.buffers:
            self.buffers[key] = [t.new_empty(t.shape[:dim] + (self.capacity,) + t.shape[dim + 1:]) for t in new]
        end = self.pos + new[0].shape[dim]
        for buf, t in zip(self.buffers[key], new):
            buf.narrow(dim, self.pos, t.shape[dim]).copy_(t)
        return tuple(buf.narrow(dim, 0, end) for buf in self.buffers[key])


class GPT(Trunk, nn.Module):
    """Causal language model: token + position embeddings, the trunk, a linear head."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        d = config.n_embd
        self.wte = nn.Embedding(config.vocab_size, d)
        self.wpe = nn.Embedding(config.block_size, d)
        self.drop = nn.Dropout(config.dropout)
        self.build_trunk(config, causal=True)
        self.lm_head = Linear(d, config.vocab_size, bias=False)
        if config.tie_weights:
            self.wte.weight = self.lm_head.weight
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        cfg = self.config
        self.lm_head.weight.normal_(0.0, 0.02)
        if not cfg.tie_weights:  # 'sigma': unit-variance token embeddings ([OT] "Experiments")
            self.wte.weight.normal_(0.0, 1.0 if cfg.init == 'sigma' else 0.02)
        self.wpe.weight.normal_(0.0, 0.02)
        for block in self.blocks:
            block.init_weights(cfg)

    def forward(self, idx, targets=None, cache=None):
        """idx (B, T) token ids -> logits (B, T, vocab), and the mean cross-entropy if targets
        (B, T) are given (-1 marks positions to ignore). With a DecodeCache, idx continues the
        sequence the cache has seen (positions cache.pos ...) and the cache takes it in."""
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} exceeds block_size={self.config.block_size}")
        pos = torch.arange(start, start + T, device=idx.device)
        x = self.trunk(self.drop(self.wte(idx) + self.wpe(pos)), cache)  # (B, T, C)
        if cache is not None:
            cache.pos += T
        logits = self.lm_head(x)  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def window_shift(self, shift=None):
        """generate()'s shift, checked; None gives the default, block_size // 4."""
        block = self.config.block_size
        shift = max(1, block // 4) if shift is None else shift
        if not 1 <= shift <= block:
            raise ValueError(f"shift={shift} must lie in [1, block_size={block}]")
        return shift

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None, use_cache=True, shift=None,
                 compile=False):
        """Append max_new_tokens sampled tokens to idx (B, T).

        The context is the sequence while it fits in block_size; once it would not, the window
        drops its oldest tokens so that `shift` steps pass before the next drop: shift=1 is
        nanoGPT's sliding window, the default block_size // 4 keeps at least 3/4 of the window.
        With use_cache the model reads each new token alone, against a DecodeCache of the
        context, and reads the whole window again only when it moves; the tokens are those of
        use_cache=False with the same shift and generator (up to float rounding in the logits).
        Runs in inference mode, whose lighter per-operation bookkeeping makes a cached step ~10%
        faster on CPU; the tokens come back as an ordinary tensor.
        compile=True runs the forwards that repeat (each cached token; each window, uncached)
        through torch.compile with dynamic shapes, which on a CPU removes most of a cached step's
        per-call overhead (docs/performance.md). The first call compiles, which takes tens of
        seconds on a CPU; later calls reuse the compiled code.
        """
        block, shift = self.config.block_size, self.window_shift(shift)
        step = torch.compile(self, dynamic=True) if compile else self
        start, cache = 0, None
        with torch.inference_mode(), maps_held(self):  # Q/K/V maps computed once, not once per token
            idx = idx.clone()  # an inference tensor like every later idx: one compiled variant, not two
            for _ in range(max_new_tokens):
                if idx.shape[1] - start > block:  # the window moves: read it again from its new start
                    start, cache = idx.shape[1] - (block - shift + 1), None
                if cache is not None:
                    logits, _ = step(idx[:, -1:], cache=cache)
                elif use_cache:  # eager: it allocates the cache's buffers, once per window
                    cache = DecodeCache(block)
                    logits, _ = self(idx[:, start:], cache=cache)
                else:
                    logits, _ = step(idx[:, start:])
                logits = logits[:, -1, :].float() / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float('inf')
                probs = F.softmax(logits, dim=-1)
                idx = torch.cat((idx, torch.multinomial(probs, 1, generator=generator)), dim=1)
        return idx.clone()  # outside inference mode: usable in autograd


# ----------------------------------------------------------------------------- 7. ViT

class ViT(Trunk, nn.Module):
    """Image classifier (Dosovitskiy et al.; the ViT of [Oh] Sec. 4.1 and [OViT]): non-overlapping
    patches linearly embedded, a [CLS] token, learned 1-D position embeddings, the same trunk
    without a causal mask, and a linear head on the [CLS] output. Global orthogonal mode is the
    plain per-sample projection here ([Oh] Alg. 2)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        d, p = config.n_embd, config.patch_size
        self.patch_embed = nn.Conv2d(config.channels, d, kernel_size=p, stride=p)  # a Linear on each patch
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_emb = nn.Parameter(torch.zeros(1, (config.image_size // p) ** 2 + 1, d))
        self.drop = nn.Dropout(config.dropout)
        self.build_trunk(config, causal=False)
        self.head = Linear(d, config.n_classes)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """'gpt2': N(0, 0.02) throughout (as timm's ViT). 'sigma': patch embeddings of unit
        variance for unit-variance pixels (N(0, 1/fan_in)), the image analogue of [OT]'s
        unit-variance token embeddings; the blocks as Block.init_weights."""
        cfg = self.config
        fan_in = cfg.channels * cfg.patch_size ** 2
        self.patch_embed.weight.normal_(0.0, 1 / math.sqrt(fan_in) if cfg.init == 'sigma' else 0.02)
        self.patch_embed.bias.zero_()
        for t in (self.cls_token, self.pos_emb, self.head.weight):
            t.normal_(0.0, 0.02)
        self.head.bias.zero_()
        for block in self.blocks:
            block.init_weights(cfg)

    def forward(self, images, labels=None):
        """images (B, C, H, W) float -> logits (B, n_classes), and the cross-entropy if labels are
        given: class indices (B,) or class probabilities (B, n_classes), as mixup makes."""
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, N, C)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_emb
        logits = self.head(self.trunk(self.drop(x))[:, 0])  # (B, n_classes)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits, labels, label_smoothing=self.config.label_smoothing)
        return logits, loss
