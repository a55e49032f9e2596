"""OrthoGPT model: transformer blocks whose residual update is pluggable, and the GPT and the ViT built of them.

The papers, cited in docstrings by their short names (docs/rules.md: where each rule departs from its paper):
  [Oh]    G. Oh, W. Cho, S. Kim, S. Choi, Y. Yu. "Revisiting Residual Connections: Orthogonal Updates for Stable and
          Efficient Deep Networks". NeurIPS 2025. arXiv:2505.11881
  [OT]    "The Orthogonal Transformer" (rotation residual, no norms); preprint, no arXiv id
  [OViT]  Y. Fei, Y. Liu, X. Wei, M. Chen. "O-ViT: Orthogonal Vision Transformer". arXiv:2201.12133
  [nGPT]  I. Loshchilov, C.-P. Hsieh, S. Sun, B. Ginsburg. "nGPT: Normalized Transformer with Representation
          Learning on the Hypersphere". ICLR 2025. arXiv:2410.01131
  [HC]    D. Zhu et al. (ByteDance Seed). "Hyper-Connections". ICLR 2025. arXiv:2409.19606
  [mHC]   Z. Xie, Y. Wei, H. Cao, et al. "mHC: Manifold-Constrained Hyper-Connections". arXiv:2512.24880
  [mHC-lite] Y. Yang, J. Gao. "mHC-lite: You Don't Need 20 Sinkhorn-Knopp Iterations". arXiv:2601.05732
  [JPmHC] B. Sengupta, J. Wang, L. Brunswic. "JPmHC: Dynamical Isometry via Orthogonal Hyper-Connections".
          arXiv:2602.18308
  [DDL]   Y. Zhang, Y. Liu, M. Wang, Q. Gu. "Deep Delta Learning". arXiv:2601.00417
  [AttnRes] Kimi Team. "Attention Residuals". arXiv:2603.15031
  [DenseFormer] M. Pagliardini, A. Mohtashami, F. Fleuret, M. Jaggi. "DenseFormer: Enhancing Information Flow in
          Transformers via Depth Weighted Averaging". NeurIPS 2024. arXiv:2402.02622
  [RoFormer] J. Su, Y. Lu, S. Pan, A. Murtadha, B. Wen, Y. Liu. "RoFormer: Enhanced Transformer with Rotary Position
          Embedding". arXiv:2104.09864
  [Primer] D. R. So et al. "Primer: Searching for Efficient Transformers for Language Modeling". arXiv:2109.08668
  [Gemma2] Gemma Team. "Gemma 2: Improving Open Language Models at a Practical Size". arXiv:2408.00118
  [nanochat] A. Karpathy. nanochat, nanochat/gpt.py (github.com/karpathy/nanochat, commit 92d63d4, 2026-07-03)
"""

import itertools
import math
from dataclasses import dataclass, field, fields, replace
from typing import Literal, get_args, get_origin

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize
from torch.utils.checkpoint import checkpoint

# ----------------------------------------------------------------------------- 1. residual updates

RESIDUALS = {}  # config value `residual` -> rule class; everything else reads the rules from here
KERNELS = {}  # hc_kernels -> fused kernels of the wide rules' two passes, which the package registers (docs/rules.md)


def register(name):
    """Class decorator: make a rule the config value residual=name. An option key is one config key whichever rule
    reads it, so a key another rule declares too must have its type and default (mHC's Options extend HC's)."""
    def add(cls):
        mine = {f.name: (f.type, f.default) for f in fields(cls.Options)}
        for other, rule in RESIDUALS.items():
            clash = [f"{f.name}: {mine[f.name]} here, {(f.type, f.default)} there" for f in fields(rule.Options)
                     if other != name and mine.get(f.name, (f.type, f.default)) != (f.type, f.default)]
            if clash:
                raise ValueError(f"residual={name!r} and residual={other!r} declare one option otherwise ("
                                 f"{'; '.join(clash)}); give {name!r}'s keys a prefix of its own (docs/rules.md)")
        RESIDUALS[name] = cls
        return cls
    return add


def wide(t):  # t in the rules' working precision: float32, or float64 for float64 inputs
    return t.to(torch.promote_types(t.dtype, torch.float32))


def stream_dtype(x):
    """A wide stream's dtype: autocast's under autocast ([mHC] Sec. 4.3.1: bfloat16 copies, float32 sums), else x's."""
    return torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype


def dot(a, b):  # <a, b> over the last dimension, kept as a dimension of size 1: (..., d) -> (..., 1)
    return (a * b).sum(-1, keepdim=True)


class Sublayer:
    """What a rule's prepare and forward get of one sublayer's forward (ResidualUpdate): `cache`, a decoding forward's
    DecodeStep (a rule that mixes positions keeps its per-position terms in it, cache.write) or None; `depth`, the
    forward's Depth (for depth rules and x0_mix) or None; `state`, what prepare leaves for forward, the rule's own."""

    def __init__(self, cache=None, depth=None):
        self.cache, self.depth, self.state = cache, depth, None


class ResidualUpdate(nn.Module):
    """The rule protocol: every hook that the model, optimizer, export and diagnostics consult, with its default (the
    fused kernels': HyperConnection's; docs/rules.md, "Writing a rule"). Around each sublayer with branch F:

        h = rule.prepare(x, sub)       # the branch's input; what forward needs, prepare leaves in sub.state
        x_next = rule(x, F(norm(h)), sub)

    By default the stream x is the (..., d) tensor the branches see and prepare hands it on: a one-stream rule writes
    forward(x, u, sub) alone."""
    keeps_norm = False  # it keeps ||x||, so the model has no norms ([OT])
    normalized = False  # nGPT's architecture
    depth = False  # it reads what earlier sublayers wrote (sub.depth), and the output as a sublayer after the last
    anchors = False  # x0_mix may mix the embeddings into its stream
    no_decay = ()  # names of its parameters, in its submodules too, that weight decay leaves alone

    @dataclass
    class Options:
        """The rule's config keys: a field each, with its type, default and a comment (what --help says of it)."""

    @classmethod
    def check(cls, cfg):  # a ValueError for options that do not fit
        pass

    @classmethod
    def from_config(cls, cfg, layer, causal):  # the rule of sublayer `layer`: 0, 1 are block 0's attention and MLP...
        return cls()

    @classmethod
    def read_out(cls, cfg, causal):  # what reads the last stream for the head (its prepare), or None: the stream itself
        return cls.from_config(cfg, 2 * cfg.n_layer, causal) if cls.depth else None  # ([AttnRes] Sec. 3.2)

    @classmethod
    def after_step(cls, model):  # after every optimizer step
        pass

    @classmethod
    def copies(cls, cfg):  # n for a stream of n copies (..., n, d) ([HC]), 0 for one stream
        return 0

    @classmethod
    def sources(cls, cfg):  # a depth rule's outputs in a forward, the start's included: Depth's fixed length
        return 0

    @classmethod
    def exported(cls, options):  # its options in a folder that carries model.py alone (orthogpt/hf.py)
        return options

    def coefficients(self, x):  # a wide rule's (read, write, mixing) on its stream x (..., n, d), for the diagnostics
        return None

    def prepare(self, x, sub):
        return x


def copied(x, n):
    """(..., d) -> n copies of it, (..., n, d), a view; n = 0: x itself (ResidualUpdate.copies)."""
    return x.unsqueeze(-2).expand(*x.shape[:-1], n, x.shape[-1]) if n else x


def combine(w, H):
    """w^T H, (..., m, d): m weighted sums of the copies H (..., n, d), weights w (..., n, m); as broadcasts, which
    torch.compile fuses into one pass (docs/rules.md)."""
    out = w[..., 0, :, None] * H[..., 0:1, :]
    for i in range(1, H.shape[-2]):
        out = out + w[..., i, :, None] * H[..., i:i + 1, :]
    return out


@register('additive')
class AdditiveUpdate(ResidualUpdate):
    """x_next = x + u: the standard residual connection ([OT] Eq. 2)."""
    anchors = True

    def forward(self, x, u, sub=None):
        return x + u


@register('orthogonal')
class OrthogonalUpdate(ResidualUpdate):
    """x_next = x + u - s x,  s = <x, u> / (||x||^2 + eps)    [Oh] Sec. 3.2, Eq. 3-4, in float32 (App. F).

    mode 'feature' (Alg. 1): one s per token; 'global' (Alg. 2): one per sample, with prefix sums over positions <= t
    in a causal model (the cache holds the earlier terms). ortho_prob (Sec. 4.4): each sample's connection orthogonal
    with that probability in training, else additive (like drop-path); in eval x + u - prob s x."""
    anchors = True

    @dataclass
    class Options:
        ortho_mode: Literal['feature', 'global'] = 'feature'  # [Oh] Alg. 1 (one s per token) or Alg. 2 (per sample)
        ortho_eps: float = 1e-6  # [Oh] Eq. 3, Sec. 4.6: the eps of s = <x, u> / (||x||^2 + eps)
        ortho_prob: float = 1.0  # [Oh] Sec. 4.4: probability that a connection is orthogonal in training
        ortho_layers: tuple[int, ...] | None = None  # [Oh] Sec. 4.5: the blocks that use it (indices); None: all

    def __init__(self, mode='feature', eps=1e-6, prob=1.0, causal=False):
        super().__init__()
        self.mode, self.eps, self.prob, self.causal = mode, eps, prob, causal

    @classmethod
    def check(cls, cfg):
        o = cfg.options
        if not o.ortho_eps >= 0:
            raise ValueError(f"ortho_eps={o.ortho_eps} must not be negative")
        if not 0.0 <= o.ortho_prob <= 1.0:
            raise ValueError(f"ortho_prob={o.ortho_prob} must lie in [0, 1]")
        bad = [i for i in o.ortho_layers or () if not 0 <= i < cfg.n_layer]
        if bad:
            raise ValueError(f"ortho_layers {bad} out of range for n_layer={cfg.n_layer} "
                             f"(valid block indices: 0..{cfg.n_layer - 1})")

    @classmethod
    def from_config(cls, cfg, layer, causal):
        o = cfg.options
        if o.ortho_prob == 0 or (o.ortho_layers is not None and layer // 2 not in o.ortho_layers):
            return AdditiveUpdate()
        return cls(o.ortho_mode, o.ortho_eps, o.ortho_prob, causal)

    def scale(self, x, u, cache=None):
        """s, broadcastable against x: (B, T, 1), or (B, 1, 1) in non-causal global mode; cache: a DecodeStep."""
        xu, xx = dot(x, u), dot(x, x)
        if self.mode == 'global' and self.causal:  # decoding: the sums over each query's visible positions
            xu, xx = ((cache.visible.to(t.dtype) @ t for t in cache.write(xu, xx, dim=-2)) if cache is not None
                      else (xu.cumsum(-2), xx.cumsum(-2)))  # (B, T, 1)
        elif self.mode == 'global':
            xu, xx = xu.sum(-2, keepdim=True), xx.sum(-2, keepdim=True)
        return xu / (xx + self.eps)

    def forward(self, x, u, sub=None):
        xf, uf = wide(x), wide(u)
        s = self.scale(xf, uf, sub and sub.cache)
        if self.prob < 1:  # the connection's draw in training, its probability in eval
            s = s * ((torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), device=x.device) < self.prob).float()
                     if self.training else self.prob)
        return (xf + uf - s * xf).to(x.dtype)


@register('rotation')
class RotationUpdate(ResidualUpdate):
    """Rotate x in the plane of (x, u): the Orthogonal Transformer ([OT] "Implementation").

        u_perp = u - (<x, u> / ||x||^2) x,   theta = ||u_perp|| / sqrt(d),
        x_next = x cos(theta) + u_perp sin(theta) / theta                    ([OT] Eq. 8)

    exp(B) x for the bivector of x and u (Eq. 4-7): ||x_next|| = ||x||, so every block input stays on the sphere of
    radius sqrt(d) with no norms. In float32; below theta = 1e-2, cos and sin/theta are their Taylor series."""
    keeps_norm = True
    small_angle = 1e-2

    def forward(self, x, u, sub=None):
        xf, uf = wide(x), wide(u)
        u_perp = uf - dot(xf, uf) / dot(xf, xf) * xf
        t = dot(u_perp, u_perp) / x.shape[-1]  # theta^2, (..., 1)
        small = t < self.small_angle ** 2
        theta = t.clamp_min(self.small_angle ** 2).sqrt()  # unused where small
        cos = torch.where(small, 1 - t / 2, theta.cos())
        sinc = torch.where(small, 1 - t / 6, theta.sin() / theta)
        return (xf * cos + u_perp * sinc).to(x.dtype)


class ScaleVector(nn.Module):
    """A learnable vector s = init at the start, stored as s' = scale and used as s' init/scale ([nGPT] Sec. 2.5):
    the optimizer's steps on s' reach s at the rate `scale` sets."""

    def __init__(self, n, init, scale):
        super().__init__()
        self.weight, self.factor = nn.Parameter(torch.full((n,), float(scale))), init / scale

    def forward(self):
        return self.weight * self.factor


@register('ngpt')
class NormalizedUpdate(ResidualUpdate):
    """h_next = Norm(h + alpha (Norm(u) - h)) on the unit sphere ([nGPT] Sec. 2.2.2, Eq. 10-11), alpha the per-dimension
    eigen learning rate (init 0.05, scale 1/sqrt(d), Sec. 2.5). No norms, nGPT's architecture, and after every step
    every embedding and matrix unit-norm along the embedding dimension (Sec. 2.1-2.4; not a ViT's convolution)."""
    keeps_norm = normalized = True

    def __init__(self, d):
        super().__init__()
        self.alpha = ScaleVector(d, 0.05, 1 / math.sqrt(d))

    @classmethod
    def from_config(cls, cfg, layer, causal):
        return cls(cfg.n_embd)

    @classmethod
    def after_step(cls, model):
        for w, dim in model.stream_matrices():  # F.normalize's arithmetic, in place
            w.div_(torch.linalg.vector_norm(w, dim=dim, keepdim=True).clamp_min(1e-12))

    def forward(self, x, u, sub=None):
        xf, uf = wide(x), wide(u)
        return F.normalize(xf + self.alpha() * (F.normalize(uf, dim=-1) - xf), dim=-1).to(x.dtype)


@register('hc')
class HyperConnection(ResidualUpdate):
    """Hyper-Connections ([HC] Sec. 2): the stream is n copies H (..., n, d) (n = hc_rate), around each branch T

        h_0 = A_m^T H,   H' = A_r^T H,   H <- B^T T(h_0) + H'                         (Eq. 3-5)

    with B, A_m (n) and A_r (n x n) static (SHC) or, by default, dynamic (DHC, Eq. 10-13): B = s_beta tanh(H_bar
    W_beta) + B_s, [A_m A_r] = s_alpha tanh(H_bar W_alpha) + [A_m A_r]_s, H_bar = LayerNorm(H) (Alg. 2), s from 0.01;
    W = [W_alpha | W_beta] (d x (n + 2)) is one parameter, so that one product gives both. Init (Eq. 14): B = 1, A_m
    the one-hot of copy layer mod n, A_r = I, W = 0. Coefficients and sums in float32, the
    copies in stream_dtype. hc_recompute: [mHC] Sec. 4.3. hc_kernels: fused kernels of prepare and forward (KERNELS)."""

    @dataclass
    class Options:
        hc_rate: int = 4  # [HC] the expansion rate n: copies of the stream
        hc_dynamic: bool = True  # [HC] Sec. 2.2: weights predicted from the stream (DHC); False: static (SHC)
        hc_recompute: bool = False  # [mHC] Sec. 4.3: backward computes the weights again (less memory)
        hc_kernels: Literal['auto', 'triton', 'torch'] = 'auto'  # fused Triton kernels ('auto': on CUDA) or this code

    no_decay = ('static_beta', 'static_alpha')

    @classmethod
    def check(cls, cfg):
        at_least_one(cfg.options, 'hc_rate')
        if cfg.options.hc_kernels == 'triton' and 'triton' not in KERNELS:
            raise ValueError("hc_kernels='triton' needs the fused kernels, which orthogpt registers where triton "
                             "imports (pip install triton); or hc_kernels='auto' (them where they run, else PyTorch)")

    def __init__(self, d, n, layer, dynamic, recompute=False, kernels='torch'):
        super().__init__()
        self.static_beta = nn.Parameter(torch.ones(n))  # B
        self.static_alpha = nn.Parameter(torch.cat([F.one_hot(torch.tensor(layer % n), n).float()[:, None],
                                                    torch.eye(n)], dim=1))  # [A_m | A_r], (n, n + 1)
        self.n, self.dynamic, self.recompute, self.kernels = n, dynamic, recompute, kernels
        if dynamic:
            self.norm = nn.LayerNorm(d)
            self.W = nn.Parameter(torch.zeros(d, n + 2))  # [W_alpha | W_beta]
            self.s_alpha, self.s_beta = nn.Parameter(torch.full((1,), 0.01)), nn.Parameter(torch.full((1,), 0.01))

    @classmethod
    def from_config(cls, cfg, layer, causal):
        o = cfg.options
        return cls(cfg.n_embd, o.hc_rate, layer, o.hc_dynamic, o.hc_recompute, o.hc_kernels)

    @classmethod
    def copies(cls, cfg):
        return cfg.options.hc_rate

    @classmethod
    def exported(cls, options):  # the kernels come with orthogpt, not model.py: 'auto' runs them where it is imported
        return replace(options, hc_kernels='auto' if options.hc_kernels == 'triton' else options.hc_kernels)

    def twin(self):  # constants from which type(self)(d, *twin()) builds this rule at width d (the kernels' proof)
        return self.n, 1, self.dynamic

    def operands(self):  # the read's tensors, project()'s and the fused kernels' (which read nothing else of a rule)
        """(kind, W, a, b, norm): products z = Norm(H) W, 'layernorm' per copy with norm's (weight, bias, eps), the read
        weights a tanh(z_i0) + b_i ('rms': mHC's); None where static (maps(None) alone)."""
        return ('layernorm', self.W, self.s_alpha, self.static_alpha[:, 0],
                (self.norm.weight, self.norm.bias, self.norm.eps)) if self.dynamic else None

    def project(self, H):
        """z = LayerNorm(H) [W_alpha | W_beta], (..., n, n + 2): the products of Eq. 10-13, one row per copy."""
        _, W, _, _, (weight, bias, eps) = self.operands()
        return F.layer_norm(H, H.shape[-1:], weight.to(H.dtype), bias.to(H.dtype), eps) @ W.to(H.dtype)

    def maps(self, z, sinkhorn_knopp=None):
        """(A_m (..., n), B (..., n), A_r^T (..., n, n)) from the products z (None: static); sinkhorn_knopp: mHC's."""
        alpha, beta = self.static_alpha, self.static_beta
        if z is not None:
            z = torch.tanh(z)
            alpha, beta = self.s_alpha * z[..., :-1] + alpha, self.s_beta * z[..., -1] + beta
        return alpha[..., 0], beta, alpha[..., 1:].mT

    def coefficients(self, H):
        """(read (..., n), write (..., n), mixing (..., n, n) or None for the identity) for the stream H (..., n, d):
        a sublayer reads sum_i read[i] H_i, and writes H_j <- sum_i mixing[j, i] H_i + write[j] u."""
        return self.maps(self.project(H) if self.dynamic else None)

    def implementation(self, x):  # the fused kernels that run this sublayer on x, or None for the code below
        fused = KERNELS.get(self.kernels)
        return fused if fused is not None and fused.takes(self, x) else None

    def prepare(self, x, sub):
        fused = self.implementation(x)
        if fused is not None:
            h, state = fused.prepare(self, x)
            sub.state = fused, state  # forward runs what prepare chose, deciding nothing again
            return h
        H = wide(x)
        with torch.autocast(H.device.type, enabled=False):  # products in float32, not rounded by mixed precision
            recompute = self.recompute and torch.is_grad_enabled()
            read, write, mixing = (checkpoint(self.coefficients, H, use_reentrant=False) if recompute else
                                   self.coefficients(H))
            sub.state = None, (write, mixing)
            return combine(read.unsqueeze(-1), H)[..., 0, :].to(x.dtype)

    def forward(self, x, u, sub):
        fused, (write, mixing) = sub.state
        if fused is not None:
            return fused.forward(self, x, u, (write, mixing))
        H, u = wide(x), wide(u)
        mixed = H if mixing is None else combine(mixing.mT, H)  # sum_i mixing[j, i] H_i
        return (mixed + write.unsqueeze(-1) * u.unsqueeze(-2)).to(stream_dtype(x))  # (..., n, d)


def sinkhorn(logits, iters):
    """[mHC] Eq. 9: exp (of logits less their maximum), then `iters` rounds of column then row normalisation: rows sum
    to 1 to rounding, columns as closely as the rounds bring them (slowly near a permutation matrix)."""
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True).detach())
    for _ in range(iters):
        m = m / m.sum(-2, keepdim=True)
        m = m / m.sum(-1, keepdim=True)
    return m


@register('mhc')
class ManifoldHyperConnection(HyperConnection):
    """mHC ([mHC] Sec. 4): H <- H_res H + H_post^T F(H_pre H) (Eq. 3) for the copies H (..., n, d), with coefficients
    per token from x' = RMSNorm(vec(H)) (Eq. 7-8; the RMSNorm's weight in phi, Sec. 4.3.1; gates a from 0.01):

        H_pre = sigmoid(a_pre x' phi_pre + b_pre),   H_post = 2 sigmoid(a_post x' phi_post + b_post),
        H_res = M(H~_res),  H~_res = a_res mat(x' phi_res) + b_res,  M by mhc_res: 'sinkhorn' (Eq. 9), 'permutation'
        (sum_k a_k P_k, a = softmax(H~_res) over the n! permutation matrices, [mHC-lite]), 'cayley' ([JPmHC] Sec. 3.1:
        [OViT]'s (I + A)^-1 (I - A), A = W - W^T, W = H~_res) or 'identity' (I: the copies never mix, the ablation of
        [HC] and [mHC]). Static (hc_dynamic=False): the biases alone. Float32 (Eq. 10-19). Init: docs/rules.md."""

    @dataclass
    class Options(HyperConnection.Options):
        mhc_res: Literal['sinkhorn', 'identity', 'permutation', 'cayley'] = 'sinkhorn'  # H_res's constraint M
        mhc_sinkhorn_iters: int = 20  # [mHC] Eq. 9: Sinkhorn-Knopp rounds (t_max)
        mhc_res_init: float = 1.0  # H~_res at init: 0 for the identity, -this for the rest (docs/rules.md)

    no_decay = ('b_pre', 'b_post', 'b_res')

    @classmethod
    def check(cls, cfg):
        super().check(cfg)
        o = cfg.options
        if o.hc_rate < 2:
            raise ValueError(f"hc_rate={o.hc_rate}: mHC mixes at least 2 copies of the stream")
        at_least_one(o, 'mhc_sinkhorn_iters')
        if not math.isfinite(o.mhc_res_init):
            raise ValueError(f"mhc_res_init={o.mhc_res_init} must be a finite number (1: logits I, the default; "
                             f"8: near I; 0: uniform)")
        if o.mhc_res == 'permutation' and o.hc_rate > 6:
            raise ValueError(f"mhc_res='permutation' mixes all {math.factorial(o.hc_rate)} permutations of "
                             f"hc_rate={o.hc_rate} copies; use hc_rate <= 6, or mhc_res='sinkhorn'")

    def __init__(self, d, n, layer, dynamic, iters, res='sinkhorn', recompute=False, res_init=Options.mhc_res_init,
                 kernels='torch'):
        nn.Module.__init__(self)
        self.n, self.dynamic, self.iters, self.res = n, dynamic, iters, res
        self.recompute, self.kernels = recompute, kernels
        perms = torch.eye(n)[torch.tensor(list(itertools.permutations(range(n))))] if res == 'permutation' else None
        self.register_buffer('perms', perms, persistent=False)  # (n!, n, n), the identity first
        # H~_res: 0 for the identity (diagonal or permutation), -res_init for the rest; Cayley's W = 0 never saturates
        initial = {'sinkhorn': (torch.eye(n) - 1) * res_init, 'cayley': torch.zeros(n, n), 'identity': None,
                   'permutation': -float(res_init) * (torch.arange(math.factorial(n)) > 0)}[res]
        self.b_pre = nn.Parameter(torch.logit(torch.softmax(F.one_hot(torch.tensor(layer % n), n).double(), 0)).float())
        self.b_post, self.b_res = nn.Parameter(torch.zeros(n)), None if initial is None else nn.Parameter(initial)
        if dynamic:
            self.phi = nn.Parameter(torch.zeros(n * d, 2 * n + (0 if initial is None else initial.numel())))
            self.a_pre, self.a_post = nn.Parameter(torch.full((1,), 0.01)), nn.Parameter(torch.full((1,), 0.01))
            self.a_res = None if initial is None else nn.Parameter(torch.full((1,), 0.01))

    @classmethod
    def from_config(cls, cfg, layer, causal):
        o = cfg.options
        return cls(cfg.n_embd, o.hc_rate, layer, o.hc_dynamic, o.mhc_sinkhorn_iters, o.mhc_res, o.hc_recompute,
                   o.mhc_res_init, o.hc_kernels)

    def twin(self):
        return self.n, 1, self.dynamic, self.iters, self.res

    def operands(self):  # 'rms': z = RMSNorm(vec(H)) phi, read weights sigmoid(a z[:n] + b) (HyperConnection's)
        return ('rms', self.phi, self.a_pre, self.b_pre, (None, None, 1e-20)) if self.dynamic else None

    def project(self, H):
        """z = x' [phi_pre | phi_post | phi_res] (..., m), x' = RMSNorm(vec(H)) (Eq. 7-8), the division after the
        product as Sec. 4.3.1 orders it (Eq. 15-16; the RMSNorm's weight is part of phi)."""
        x, (_, phi, _, _, (_, _, eps)) = H.flatten(-2), self.operands()  # (..., n d)
        return (x @ phi.to(x.dtype)) * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)

    def maps(self, z, sinkhorn_knopp=None):
        """(H_pre (..., n), H_post (..., n), H_res (..., n, n) or None for the identity) from the projection z (None:
        static, the biases alone); sinkhorn_knopp: an implementation of sinkhorn() to use (the fused kernels')."""
        n, pre, post, res = self.n, self.b_pre, self.b_post, self.b_res
        if z is not None:
            pre, post = self.a_pre * z[..., :n] + pre, self.a_post * z[..., n:2 * n] + post
            if res is not None:
                res = self.a_res * z[..., 2 * n:].unflatten(-1, res.shape) + res
        if res is not None:  # H~_res (..., n, n), or (..., n!) for the permutations
            res = ((sinkhorn_knopp or sinkhorn)(res, self.iters) if self.res == 'sinkhorn' else
                   cayley(res) if self.res == 'cayley' else
                   torch.einsum('...k,kij->...ij', torch.softmax(res, -1), self.perms.to(res.dtype)))
        return torch.sigmoid(pre), 2 * torch.sigmoid(post), res


@register('ddl')
class DeltaUpdate(ResidualUpdate):
    """Deep Delta Learning ([DDL] Sec. 2.1 and 3.1, Eq. 2.2, d_v = 1): a rank-1 delta rule on the stream,

        x_next = x + beta (v - <k, x>) k,   k = u / sqrt(||u||^2 + eps^2),   beta = 2 sigmoid(w_beta . c + b),
        v = w_v . c,   c = RMSNorm(x)

    (App. A.1): the branch output gives the direction k alone; beta in [0, 2] and v come from the context c (the
    pre-norm's gain in w_beta and w_v). beta = 0 is the identity, 1 sets <k, x_next> = v, and 2 with v = 0 reflects x
    (Householder, ||x|| kept). beta starts near ddl_beta_init (their code's default 1); w ~ N(0, 0.25 / d), their
    code's. Float32. docs/rules.md: where their code's v differs."""
    anchors = True

    @dataclass
    class Options:
        ddl_beta_init: float = 1.0  # [DDL] App. A.1: beta at init, in (0, 2)
        ddl_eps: float = 1e-5  # [DDL] Sec. 3.1: k = u / sqrt(||u||^2 + eps^2)

    @classmethod
    def check(cls, cfg):
        o = cfg.options
        if not 0 < o.ddl_beta_init < 2:
            raise ValueError(f"ddl_beta_init={o.ddl_beta_init} must lie in (0, 2), which beta = 2 sigmoid(.) spans")
        if not o.ddl_eps >= 0:
            raise ValueError(f"ddl_eps={o.ddl_eps} must not be negative")

    def __init__(self, d, beta_init=1.0, eps=1e-5):
        super().__init__()
        self.w_beta, self.w_v = (nn.Parameter(torch.randn(d) * 0.5 / math.sqrt(d)) for _ in range(2))
        self.b_beta, self.eps = nn.Parameter(torch.logit(torch.tensor([beta_init / 2]))), eps

    @classmethod
    def from_config(cls, cfg, layer, causal):
        return cls(cfg.n_embd, cfg.options.ddl_beta_init, cfg.options.ddl_eps)

    def forward(self, x, u, sub=None):
        xf, uf = wide(x), wide(u)
        c = F.rms_norm(xf, xf.shape[-1:])
        k = uf * torch.rsqrt(dot(uf, uf) + self.eps ** 2)
        beta = 2 * torch.sigmoid(dot(c, self.w_beta) + self.b_beta)
        return (xf + beta * (dot(c, self.w_v) - dot(k, xf)) * k).to(x.dtype)


@register('attnres')
class AttentionResidual(ResidualUpdate):
    """Attention Residuals ([AttnRes] Sec. 3.1, Eq. 2-4): each sublayer reads a softmax mixture over depth of the
    embeddings v_0 and every earlier sublayer's output v_i, in place of a residual stream,

        h_l = sum_{i<l} a_{i,l} v_i,   a_{i,l} = softmax_i(w_l . RMSNorm(v_i)),

    w_l a query per sublayer, 0 at init: the uniform mean of n sources, x / n for the additive stream x, which a
    pre-norm reads as x with n^2 times its eps (docs/rules.md: what that does to GPT-2's block). attnres_block = S > 1
    is Block AttnRes (Sec. 3.2, Eq. 5-6): the sources are the embeddings, each completed block of S sublayers' sum,
    and the current block's sum so far. One more query reads the output; forward passes on the sources' sum. The first
    sublayer's one source weighs 1 whatever its query: it has no query and no norm (no gradient would reach them)."""
    depth = True

    @dataclass
    class Options:
        attnres_block: int = 1  # [AttnRes] Sec. 3.2: sublayers in a block (attention and MLP count one each); 1: full

    @classmethod
    def check(cls, cfg):
        at_least_one(cfg.options, 'attnres_block')

    def __init__(self, d, layer, block=1):
        super().__init__()
        self.query, self.norm = (nn.Parameter(torch.zeros(d)), nn.RMSNorm(d)) if layer else (None, None)
        self.completes = (layer + 1) % block == 0  # the last sublayer of a block (not the layer: one graph serves all)

    @classmethod
    def from_config(cls, cfg, layer, causal):
        return cls(cfg.n_embd, layer, cfg.options.attnres_block)

    @classmethod
    def sources(cls, cfg):
        return 1 + 2 * cfg.n_layer // cfg.options.attnres_block

    def weights(self, depth):  # Eq. 2-4: (a_{i,l} (sources, ...), the sources v_i (..., d)), prepare's and diagnostics'
        sources, held = depth.sources()
        held = held.view(-1, *[1] * sources[0].dim())  # (sources, 1, ..., 1)
        if self.query is None:  # the first sublayer's one source
            return held.to(sources[0].dtype).expand(-1, *sources[0].shape[:-1], 1), sources
        # w . RMSNorm(v) = <v, g w> / rms(v), the sources never stacked: backward keeps each once, not once a sublayer
        key, eps = self.norm.weight * self.query, self.norm.eps or torch.finfo(sources[0].dtype).eps
        logits = torch.stack([dot(v, key) * torch.rsqrt(dot(v, v) / v.shape[-1] + eps) for v in sources])
        return torch.softmax(logits.masked_fill(~held, -math.inf), 0), sources

    def prepare(self, x, sub):
        sub.depth = sub.depth or Depth(x)  # alone, outside a trunk: x is the only source
        return sum(w * v for w, v in zip(*self.weights(sub.depth))).to(x.dtype)

    def forward(self, x, u, sub):
        u, depth = wide(u), sub.depth
        depth.partial = u if depth.partial is None else depth.partial + u
        if self.completes:  # the block's sum is a source of its own
            depth.append(depth.partial)
            depth.partial = None
        return (x + u).to(x.dtype)


@register('denseformer')
class DenseFormerUpdate(ResidualUpdate):
    """DenseFormer ([DenseFormer] Sec. 3): additive, and after each block the depth-weighted average (DWA) of the
    embeddings X_0 and every block's output X_j so far, which the next block (or the head) reads,

        Y_i = sum_{j<=i} alpha_{i,j} X_j,

    free scalars, alpha_{i,i} = 1, the rest 0 at init: the plain transformer exactly. Dilation, period 1 (defaults)."""
    depth = True

    def __init__(self, layer):
        super().__init__()
        k = layer // 2 + 1  # an MLP's sublayer (odd) ends block k - 1; the attention's and the output's hold no weights
        self.alpha = nn.Parameter(F.one_hot(torch.tensor(k), k + 1).float()) if layer % 2 else None

    @classmethod
    def from_config(cls, cfg, layer, causal):
        return cls(layer)

    @classmethod
    def sources(cls, cfg):
        return 1 + cfg.n_layer

    def prepare(self, x, sub):
        sub.depth = sub.depth or Depth(x)  # alone, outside a trunk: x is the only output so far
        return x

    def forward(self, x, u, sub):
        x = x + u
        if self.alpha is None:
            return x
        sub.depth.append(x)  # X_i, block i's output
        outputs = sub.depth.outputs  # the last len(alpha) of them, after Depth's zeros where it has them
        return sum(a * X for a, X in zip(F.pad(self.alpha.to(x.dtype), (len(outputs) - len(self.alpha), 0)), outputs))


# ----------------------------------------------------------------------------- 2. orthogonal Q/K/V

def cayley(w):
    """[OViT] Alg. 2 for a stack (..., d, d): 2 (I + A)^-1 - I = (I + A)^-1 (I - A) (Eq. 11) with A = W - W^T. I + A
    is invertible for every skew A, so inv_ex skips its error check (no host sync)."""
    eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
    return 2 * torch.linalg.inv_ex(eye + w - w.mT)[0] - eye


def exp_map(w):  # the matrix exponential of A = W - W^T ([OViT] Sec. 3.2, the Exp-ViT comparison)
    return torch.linalg.matrix_exp(w - w.mT)


QKV_MAPS = {'dense': None, 'cayley': cayley, 'exp': exp_map}  # config value `qkv` -> map (None: a plain weight)


class OrthogonalQKV(nn.Module):
    """Maps a raw (3d, d) weight to three stacked orthogonal d x d matrices ([OViT] Alg. 1-2) in float32, as a torch
    parametrization: the optimizer steps the raw W ([OViT] Sec. 3.3; torch's parametrizations.orthogonal would step
    other coordinates). Training holds in `held` the value of one batched call for all layers."""

    def __init__(self, kind):
        super().__init__()
        self.kind, self.map, self.held = kind, QKV_MAPS[kind], None

    def forward(self, w):  # (3d, d), or a stack of them (..., 3d, d)
        if self.held is not None:
            return self.held
        d = w.shape[-1]
        with torch.autocast(w.device.type, enabled=False):
            q = self.map(wide(w).view(-1, d, d))  # (3 x layers, d, d)
        return q.reshape(w.shape).to(w.dtype)


# ----------------------------------------------------------------------------- 3. configs

def at_least_one(cfg, *keys):
    for key in keys:
        if getattr(cfg, key) < 1:
            raise ValueError(f"{key}={getattr(cfg, key)} must be at least 1")


def check_choices(obj):
    """ValueError for a field of the dataclass obj not among its Literal type's values (or its metadata's choices)."""
    for f in fields(obj):
        choices = get_args(f.type) if get_origin(f.type) is Literal else f.metadata.get('choices')
        if choices is not None and getattr(obj, f.name) not in choices:
            raise ValueError(f"{f.name}={getattr(obj, f.name)!r} is not one of {' | '.join(map(repr, choices))}")


@dataclass
class BlockConfig:
    """Everything a Block needs; shared by every model built from Blocks."""
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block
    n_embd: int = 768  # width of the residual stream
    dropout: float = 0.0  # dropout on attention weights, branch outputs and embeddings
    bias: bool = False  # bias in Linear layers and LayerNorm
    norm: Literal['layernorm', 'rmsnorm'] = 'layernorm'  # pre-norm type (none with a norm-keeping rule)
    norm_gain: bool = True  # the norms' learnable gain (and bias); False: parameter-free norms ([nanochat])
    activation: Literal['gelu', 'gelu_tanh', 'relu', 'relu2'] = 'gelu'  # the standard MLP's; relu2: ReLU(x)^2
    pos: Literal['learned', 'rope'] = 'learned'  # positions: learned embeddings added to the tokens, or rotary (RoPE)
    rope_base: float = 10000.0  # RoPE's base b: pair i of a head turns by m b^(-2i/hs) at position m ([nanochat]: 1e5)
    qk_norm: bool = False  # a parameter-free RMSNorm of each head's q and k, after RoPE ([nanochat]); nGPT: its own
    value_embeds: bool = False  # per-layer token embeddings added to attention's values, gated ([nanochat])
    logit_softcap: float = 0.0  # logits c tanh(z / c) for c > 0 ([Gemma2]; [nanochat]: 15); 0: off
    mlp: Literal['standard', 'gated'] = 'standard'  # 'gated': u * SiLU(v), u and v from one matrix twice as wide
    mlp_ratio: float | None = None  # the MLP's hidden width / n_embd; None: 4, or 8/3 gated (the same parameters)
    residual: str = field(default='additive', metadata={'choices': RESIDUALS})  # the update rule
    options: object = field(default_factory=dict)  # the rule's own keys: its Options, or a dict of them
    qkv: str = field(default='dense', metadata={'choices': QKV_MAPS})  # [OViT] Sec. 3: Q/K/V maps dense or orthogonal
    init: Literal['gpt2', 'sigma'] = 'gpt2'  # weight initialisation; 'sigma': [OT] "Experiments"
    sigma_w: float = 0.5  # 'sigma' init: std of V, out-proj and MLP weights is sigma_w/sqrt(d)
    sigma_qk: float = 1.0  # 'sigma' init: std of Q and K weights is sigma_qk/sqrt(d)
    x0_mix: Literal['off', 'identity', 'nanochat'] = 'off'  # the speedruns' x <- a x + b x0 before each block

    def __post_init__(self):
        at_least_one(self, 'n_layer', 'n_head', 'n_embd')
        for key in ('sigma_w', 'sigma_qk', 'logit_softcap'):
            if not getattr(self, key) >= 0:
                raise ValueError(f"{key}={getattr(self, key)} must not be negative")
        if not self.rope_base > 1:
            raise ValueError(f"rope_base={self.rope_base} must exceed 1 (RoFormer's 10000; nanochat's 100000)")
        check_choices(self)
        if self.mlp_ratio is not None and not self.mlp_ratio > 0:
            raise ValueError(f"mlp_ratio={self.mlp_ratio} must be positive")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                             f"choose n_head among {[h for h in range(1, 17) if self.n_embd % h == 0]}")
        if self.pos == 'rope' and self.n_embd // self.n_head % 2:
            raise ValueError(f"pos='rope' turns pairs of a head's dimensions, and n_embd / n_head = "
                             f"{self.n_embd // self.n_head} is odd; choose an even head width")
        rule = RESIDUALS[self.residual]
        names = [f.name for f in fields(rule.Options)]
        if not isinstance(self.options, (dict, rule.Options)):  # another rule's: the keys this rule shares with it
            self.options = {f.name: getattr(self.options, f.name) for f in fields(self.options) if f.name in names}
        if isinstance(self.options, dict):
            unknown = sorted(set(self.options) - set(names))
            if unknown:
                raise ValueError(f"{', '.join(unknown)}: not options of residual={self.residual!r} "
                                 f"(its options: {', '.join(names) or 'none'})")
            self.options = rule.Options(**self.options)
        check_choices(self.options)
        rule.check(self)
        if self.x0_mix != 'off' and not rule.anchors:
            raise ValueError(f"x0_mix={self.x0_mix!r} mixes the embeddings into the stream, which residual="
                             f"{self.residual!r} does not allow (a stream kept on a sphere, or not one vector); use "
                             f"x0_mix='off', or residual {' or '.join(n for n, r in RESIDUALS.items() if r.anchors)}")


@dataclass
class ViTConfig(BlockConfig):
    image_size: int = 32  # height and width of the (square) images
    patch_size: int = 4  # side of the square patches, each one token
    channels: int = 3  # colour channels of the images
    n_classes: int = 10  # classes of the head
    label_smoothing: float = 0.0  # of the training cross-entropy

    def __post_init__(self):
        super().__post_init__()
        at_least_one(self, 'image_size', 'patch_size', 'channels', 'n_classes')
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size={self.image_size} is not a multiple of patch_size={self.patch_size}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing={self.label_smoothing} must lie in [0, 1)")
        if self.pos == 'rope':
            raise ValueError("pos='rope' numbers a sequence, and a ViT's tokens are a 2-D grid of patches and a "
                             "[CLS] token; the ViT keeps its learned positions: pos='learned'")
        if self.value_embeds:
            raise ValueError("value_embeds=True looks up a vector per token id, and a ViT's tokens are patches; "
                             "use value_embeds=False")


@dataclass
class GPTConfig(BlockConfig):
    block_size: int = 1024  # context length in tokens
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64 (a dataset's own vocabulary replaces it)
    tie_weights: bool = True  # share wte and lm_head (GPT-2)

    def __post_init__(self):
        super().__post_init__()
        at_least_one(self, 'block_size', 'vocab_size')
        if self.init == 'sigma' and self.tie_weights:
            raise ValueError("init='sigma' needs tie_weights=False: its unit-variance token embeddings "
                             "would make a tied output head emit logits of std ~sqrt(n_embd)")


# ----------------------------------------------------------------------------- 4. Block

def raw(linear):  # the weight a Linear's optimizer steps: its raw W where a Q/K/V map reads one, else its weight
    return linear.parametrizations.weight.original if parametrize.is_parametrized(linear) else linear.weight


def make_norm(cfg, keeps_norm):  # none where the stream is already on the sphere ([OT] "Experiments")
    return (nn.Identity() if keeps_norm else nn.RMSNorm(cfg.n_embd, elementwise_affine=cfg.norm_gain)
            if cfg.norm == 'rmsnorm' else nn.LayerNorm(cfg.n_embd, elementwise_affine=cfg.norm_gain, bias=cfg.bias))


def rotary(x, positions, base):
    """RoPE ([RoFormer] Sec. 3.2.2, Eq. 34): x (..., T, hs) with the pair (x_i, x_{i + hs/2}) turned by the angle
    m base^(-2i/hs) at position m, positions (T,). The pairs are the two halves of a head, as GPT-NeoX and [nanochat]
    pair them (RoFormer pairs x_{2i}, x_{2i+1}: the same map up to a fixed order of q's and k's coordinates), and the
    sense is RoFormer's. Angles in float32 (float64 for float64 x)."""
    half, dtype = x.shape[-1] // 2, torch.promote_types(x.dtype, torch.float32)
    angle = positions.to(dtype)[:, None] * base ** (-torch.arange(half, device=x.device, dtype=dtype) / half)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def has_value_embeds(cfg, block):  # [nanochat]'s layers: every other one, the last among them
    return cfg.value_embeds and block % 2 == (cfg.n_layer - 1) % 2


class SelfAttention(nn.Module):
    """Multi-head self-attention, causal or not. q and k: RoPE (pos='rope'), then, as in [nanochat] and nGPT's code,
    the norm: parameter-free (qk_norm), or `normalized`, nGPT's, scaled by s_qk ([nGPT] Sec. 2.3.2). ve: the value
    embeddings (B, T, C) of a layer that has them, added to v at a gate 3 sigmoid(W x[:12]) per head ([nanochat])."""

    def __init__(self, cfg, causal, normalized, gated=False):
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        if QKV_MAPS[cfg.qkv] is not None:
            parametrize.register_parametrization(self.c_attn, 'weight', OrthogonalQKV(cfg.qkv))
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.n_head, self.dropout, self.causal = cfg.n_head, cfg.dropout, causal
        self.rope_base, self.qk_norm = cfg.rope_base if cfg.pos == 'rope' else None, cfg.qk_norm
        self.s_qk = ScaleVector(cfg.n_embd, 1.0, 1 / math.sqrt(cfg.n_embd)) if normalized else None  # per head, dim
        self.ve_gate = nn.Linear(min(12, cfg.n_embd), cfg.n_head, bias=False) if gated else None

    def forward(self, x, cache=None, ve=None):
        B, T, C = x.shape
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # (B, nh, T, hs); a permute's backward copies more
        if self.ve_gate is not None:  # ve in v's dtype (nanochat's cast): under autocast, the table is float32
            gate = 3 * torch.sigmoid(self.ve_gate(x[..., :self.ve_gate.in_features]))  # (B, T, nh)
            v = v + (gate.unsqueeze(-1) * ve.view(B, T, self.n_head, -1)).transpose(1, 2).to(v.dtype)
        if self.rope_base is not None:
            positions = cache.positions if cache is not None else torch.arange(T, device=x.device)
            q, k = rotary(q, positions, self.rope_base), rotary(k, positions, self.rope_base)
        scale = None  # SDPA's 1/sqrt(hs)
        if self.s_qk is not None:  # [nGPT] Eq. 15-16: cosines of q and k, scaled by s_qk, softmax scale sqrt(hs)
            s_qk = self.s_qk().view(self.n_head, 1, -1)  # (nh, 1, hs)
            q, k, scale = F.normalize(q, dim=-1) * s_qk, F.normalize(k, dim=-1) * s_qk, math.sqrt(C // self.n_head)
        elif self.qk_norm:
            q, k = F.rms_norm(q, q.shape[-1:]), F.rms_norm(k, k.shape[-1:])
        mask = None
        if cache is not None:  # every position of the state's buffers, each query seeing those up to its own
            (k, v), mask = cache.write(k, v, dim=2), cache.visible  # (B, nh, block_size, hs), (T, block_size)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=self.causal and mask is None, scale=scale)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))  # heads side by side: (B, T, C)


class MLP(nn.Module):
    """Linear -> activation -> Linear ('standard'), or u * SiLU(v) with u and v from one Linear twice as wide ('gated',
    nGPT's SwiGLU). `normalized`: u s_u and v s_v sqrt(d) ([nGPT] Sec. 2.4.2, Eq. 20-21; 'standard': v's alone)."""

    def __init__(self, cfg, normalized):
        super().__init__()
        self.gated = cfg.mlp == 'gated'
        hidden = round((cfg.mlp_ratio or (8 / 3 if self.gated else 4)) * cfg.n_embd)  # 8/3: the parameters of 4 x
        self.c_fc = nn.Linear(cfg.n_embd, hidden * (2 if self.gated else 1), bias=cfg.bias)
        self.act = (nn.SiLU() if self.gated else nn.ReLU() if cfg.activation == 'relu' else
                    ReLU2() if cfg.activation == 'relu2' else
                    nn.GELU(approximate='tanh' if cfg.activation == 'gelu_tanh' else 'none'))
        self.s_uv = ScaleVector(self.c_fc.out_features, 1.0, 1.0) if normalized else None
        self.c_proj = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):  # (..., C), read on its 2-D view: of a 3-D ReLU, inductor saves a bool mask, slow on a CPU
        h = self.c_fc(x.flatten(0, -2))  # (N, hidden), gated: (N, 2 hidden)
        if self.s_uv is not None:
            h = h * self.s_uv()
        u, v = h.chunk(2, dim=-1) if self.gated else (None, h)
        v = v if self.s_uv is None else v * math.sqrt(x.shape[-1])
        h = self.act(v) if u is None else u * self.act(v)
        return self.dropout(self.c_proj(h)).view_as(x)


class ReLU2(nn.Module):
    """ReLU(x)^2 ([Primer] Sec. 4, "squared ReLU"; [nanochat]'s MLP)."""

    def forward(self, x):
        return F.relu(x).square()


class Depth:
    """What one forward's sublayers wrote, for a rule that reads it (ResidualUpdate.depth) and for x0_mix: `anchor`,
    what x0_mix mixes in, and what such a rule keeps as it goes: `outputs`, from [start] (the stream the first block
    reads), and a running sum `partial`. Everything is per position: decoding needs nothing more. With a length (the
    rule's sources; per-block compile), `outputs` keeps it, zeros first, `held` marking the outputs: one graph serves
    every block. The zeros are distinct tensors like start (a graph's inputs differ in no alias, stride or grad)."""

    def __init__(self, start, anchor=None, length=0):
        self.anchor, self.partial, self.length = anchor, None, length
        zeros = [torch.zeros_like(start).requires_grad_(start.requires_grad) for _ in range(length - 1)]
        self.outputs = zeros + [start]
        self.held = torch.arange(len(self.outputs), device=start.device) >= len(self.outputs) - 1

    def append(self, x):  # a new output, last; with a length, the first zeros make room
        self.outputs = self.outputs[1:] + [x] if self.length else self.outputs + [x]
        self.held = torch.cat([self.held[1:] if self.length else self.held, self.held.new_ones(1)])

    def sources(self):  # (every output and the partial sum, held (sources,): which are not Depth's zeros)
        partial = [] if self.partial is None else [self.partial]
        return self.outputs + partial, torch.cat([self.held, self.held.new_ones(len(partial))])


class StreamAnchor(nn.Module):
    """x <- lambda_r x + lambda_0 x0 before a block, x0 = RMSNorm(the embeddings), two learnable scalars: modded-
    nanogpt's ('identity': (1, 0), the plain model at init), nanochat's (1.15 to 1.05, 0.20 to 0.05 over depth)."""

    def __init__(self, kind, layer, n_layer):
        super().__init__()
        f = layer / max(n_layer - 1, 1)
        r, z = (1.0, 0.0) if kind == 'identity' else (1.15 - 0.10 * f, 0.20 - 0.15 * f)
        self.resid, self.x0 = nn.Parameter(torch.tensor([r])), nn.Parameter(torch.tensor([z]))

    def forward(self, x, x0):
        return self.resid * x + self.x0 * x0


class Block(nn.Module):
    """x <- update(x, attn(norm(h))); x <- update(x, mlp(norm(h))), each h the branch input the rule prepares from x."""

    def __init__(self, cfg, layer, causal, normalized=False):  # normalized: nGPT's branches, as the rule says
        super().__init__()
        rule = RESIDUALS[cfg.residual]
        self.anchor = StreamAnchor(cfg.x0_mix, layer, cfg.n_layer) if cfg.x0_mix != 'off' else None
        self.ln_1 = make_norm(cfg, rule.keeps_norm)
        self.attn = SelfAttention(cfg, causal, normalized, has_value_embeds(cfg, layer))
        self.update_attn = rule.from_config(cfg, 2 * layer, causal)
        self.ln_2 = make_norm(cfg, rule.keeps_norm)
        self.mlp = MLP(cfg, normalized)
        self.update_mlp = rule.from_config(cfg, 2 * layer + 1, causal)

    def forward(self, x, cache=None, depth=None, ve=None):  # (B, T, C), or the rule's wider stream; depth: a Depth
        if self.anchor is not None:
            x = self.anchor(x, depth.anchor)
        a, m = Sublayer(cache, depth), Sublayer(cache, depth)
        x = self.update_attn(x, self.attn(self.ln_1(self.update_attn.prepare(x, a)), cache, ve), a)  # (B, T, C)
        return self.update_mlp(x, self.mlp(self.ln_2(self.update_mlp.prepare(x, m))), m)

    @torch.no_grad()
    def init_weights(self, cfg):
        """'gpt2': N(0, 0.02), output projections N(0, 0.02/sqrt(2 n_layer)) (GPT-2 paper). 'sigma' ([OT]
        "Experiments"): Q, K ~ N(0, sigma_qk^2/d); V, out-proj, the MLP's first matrix ~ N(0, sigma_w^2/d); its second
        ~ N(0, 2 sigma_w^2/h), h its hidden width, the 2 compensating ReLU's halving of the variance. Under a Cayley/exp
        map this initialises the raw W the map reads."""
        d = cfg.n_embd
        for lin in (self.attn.c_attn, self.attn.c_proj, self.mlp.c_fc, self.mlp.c_proj):
            if lin.bias is not None:
                lin.bias.zero_()
        qkv = raw(self.attn.c_attn)
        if cfg.init == 'gpt2':
            for w in (qkv, self.mlp.c_fc.weight):
                w.normal_(0.0, 0.02)
            for w in (self.attn.c_proj.weight, self.mlp.c_proj.weight):
                w.normal_(0.0, 0.02 / math.sqrt(2 * cfg.n_layer))
        else:
            qkv[:2 * d].normal_(0.0, cfg.sigma_qk / math.sqrt(d))
            for w in (qkv[2 * d:], self.attn.c_proj.weight, self.mlp.c_fc.weight):
                w.normal_(0.0, cfg.sigma_w / math.sqrt(d))
            self.mlp.c_proj.weight.normal_(0.0, cfg.sigma_w * math.sqrt(2 / self.mlp.c_proj.in_features))
        if self.attn.ve_gate is not None:  # [nanochat]'s: the gates start a little above 1.5
            self.attn.ve_gate.weight.uniform_(0.0, 0.02)


# ----------------------------------------------------------------------------- 5. Trunk, GPT, ViT

class Sphere(nn.Module):  # x / ||x|| in float32: onto the unit sphere, where the normalized Transformer's stream lives
    def forward(self, x):
        return F.normalize(wide(x), dim=-1).to(x.dtype)


class Trunk:
    """The stack both models share, a mixin: ln_emb -> blocks -> ln_f. With a norm-keeping rule, the Orthogonal
    Transformer's ([OT] "Experiments"): one weightless RMSNorm after the embeddings and no other norm, so every block
    sees ||x|| = sqrt(d); nGPT's: ||x|| = 1, logits scaled by s_z ([nGPT] Sec. 2.1)."""

    def build_trunk(self, config, causal, n_out):
        self.rule = RESIDUALS[config.residual]
        keeps_norm, normalized = self.rule.keeps_norm, self.rule.normalized
        # eps far below any embedding's mean square, so the norm is sqrt(d) to float32 rounding
        self.ln_emb = (Sphere() if normalized else
                       nn.RMSNorm(config.n_embd, eps=1e-30, elementwise_affine=False) if keeps_norm else nn.Identity())
        self.blocks = nn.ModuleList([Block(config, i, causal, normalized) for i in range(config.n_layer)])
        self.read_out = self.rule.read_out(config, causal)
        self.ln_f = make_norm(config, keeps_norm)
        self.s_z = ScaleVector(n_out, 1.0, 1 / math.sqrt(config.n_embd)) if normalized else None
        self.fixed_depth = False  # Depth's lists of one length (orthogpt/regional.py)

    def scaled(self, logits):  # nGPT's s_z, then the soft-cap ([Gemma2] Sec. 2), in float32 as [nanochat]
        logits, cap = logits if self.s_z is None else logits * self.s_z(), self.config.logit_softcap
        return cap * torch.tanh(wide(logits) / cap) if cap else logits

    def trunk(self, x, cache=None, values=None):  # (B, T, C) embeddings -> (B, T, C) features; values: blocks' ve
        n = self.rule.copies(self.config)
        x = copied(self.ln_emb(x), n)  # (B, T, C), or n copies (B, T, n, C)
        anchor = F.rms_norm(x, x.shape[-1:]) if self.config.x0_mix != 'off' else None  # x0_mix's, once a forward
        length = self.rule.sources(self.config) if self.fixed_depth else 0
        depth = Depth(x, anchor, length) if self.rule.depth or anchor is not None else None
        for i, block in enumerate(self.blocks):
            x = block(x, cache and cache.at(i), depth, values[i] if values else None)
        if self.read_out is not None:
            x = self.read_out.prepare(x, Sublayer(cache and cache.at(len(self.blocks)), depth))
        return self.ln_f(x.mean(-2) if n else x)

    def stream_matrices(self):
        """(weight, dim) of every embedding, head and block matrix that reads the stream (dim -1) or writes into it
        (dim 0), dim indexing its features; each once (a tied head is the embedding), not a Q/K/V map's raw W."""
        found = dict(self.own_stream_matrices())
        for b in self.blocks:
            reads = [lin for lin in (b.attn.c_attn, b.mlp.c_fc) if not parametrize.is_parametrized(lin)]
            found.update([(lin.weight, -1) for lin in reads] + [(b.attn.c_proj.weight, 0), (b.mlp.c_proj.weight, 0)])
        return list(found.items())

    @torch.no_grad()
    def after_step(self):  # after each optimizer step: the rule's ResidualUpdate.after_step
        self.rule.after_step(self)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())


class DecodeState:
    """What decoding carries from one GPT.forward to the next, in tensors of fixed shape: each layer's per-position
    buffers, block_size positions long (attention's keys and values, a rule's terms), and `pos`, the next position, a
    tensor on the device. Forwards write in place at their positions, so that every step has the same shapes and
    addresses, as one compiled step replayed as a CUDA graph needs; a window that moves on is read again from pos = 0
    into the same buffers, and each query sees only the positions up to its own."""

    def __init__(self, capacity, device=None):  # buffers: {layer: the tensors of each write its forward makes}
        self.capacity, self.buffers, self.pos = capacity, {}, torch.zeros((), dtype=torch.long, device=device)

    def tensors(self):
        return [t for writes in self.buffers.values() for ts in writes for t in ts]

    def advance(self, T):
        """The DecodeStep of a forward of the next T tokens; pos moves past them (checked on the device: no sync)."""
        positions = self.pos + torch.arange(T, device=self.pos.device)  # (T,)
        torch._assert_async(positions[-1] < self.capacity, f"decoding past block_size={self.capacity}, the positions a "
                            f"DecodeState holds (a window that moves on reads again from 0: state.pos.zero_())")
        self.pos.add_(T)
        return DecodeStep(self, positions)


class DecodeStep:
    """A forward's view of a DecodeState: its positions (T,), which positions each sees, visible (T, block_size), and
    at(layer), a block's, whose writes are its layer's buffers in the order it makes them: no module is a key, so that
    one compiled graph serves every block (orthogpt/regional.py)."""

    def __init__(self, state, positions, visible=None, held=None):
        if visible is None:  # (T, block_size), once a forward: a block's view shares it
            visible = torch.arange(state.capacity, device=positions.device) <= positions[:, None]
        self.state, self.positions, self.visible, self.held, self.written = state, positions, visible, held, 0

    def at(self, layer):
        return DecodeStep(self.state, self.positions, self.visible, self.state.buffers.setdefault(layer, []))

    def write(self, *new, dim):
        """Write tensors `new` (positions along dim) at these positions; returns their whole buffers."""
        if isinstance(new[0], nn.Module):  # the form before a block's writes were its layer's
            raise TypeError("cache.write(module, *tensors, dim=...) is now cache.write(*tensors, dim=...): drop module")
        dim, k, self.written = dim % new[0].dim(), self.written, self.written + 1
        if k == len(self.held):  # at the first forward, eager; zeros: the positions hidden stay finite
            self.held.append([t.new_zeros(t.shape[:dim] + (self.state.capacity,) + t.shape[dim + 1:]) for t in new])
        for buf, t in zip(self.held[k], new):
            buf.index_copy_(dim, self.positions, t)
        return self.held[k]


class GPT(Trunk, nn.Module):
    """Causal language model: token (+ learned position) embeddings, the trunk, a linear head. value_embeds: a token
    embedding per layer that has them, which that layer's attention adds to its values ([nanochat])."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.pos == 'learned' else None
        self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(config.vocab_size, config.n_embd)
                                           for i in range(config.n_layer) if has_value_embeds(config, i)})
        self.drop = nn.Dropout(config.dropout)
        self.build_trunk(config, causal=True, n_out=config.vocab_size)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.wte.weight = self.lm_head.weight
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        cfg = self.config
        self.lm_head.weight.normal_(0.0, 0.02)
        if not cfg.tie_weights:  # 'sigma': unit-variance token embeddings ([OT] "Experiments")
            self.wte.weight.normal_(0.0, 1.0 if cfg.init == 'sigma' else 0.02)
        if self.wpe is not None:
            self.wpe.weight.normal_(0.0, 0.02)
        for ve in self.value_embeds.values():  # as V's weights ([nanochat])
            ve.weight.normal_(0.0, 0.02 if cfg.init == 'gpt2' else cfg.sigma_w / math.sqrt(cfg.n_embd))
        for block in self.blocks:
            block.init_weights(cfg)
        self.after_step()  # the state every optimizer step leaves: for nGPT, unit-norm weights

    def own_stream_matrices(self):
        return [(m.weight, -1) for m in (self.wte, self.wpe, self.lm_head) if m is not None]

    def forward(self, idx, targets=None, cache=None, last=False):
        """idx (B, T) token ids -> logits (B, T, vocab), and the mean cross-entropy of targets (B, T) if given (-1:
        ignored). With a DecodeState, idx continues the sequence it holds, at its position, and it takes idx in.
        last: the head on the last position alone, logits (B, 1, vocab), which is all that decoding reads."""
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} exceeds block_size={self.config.block_size}")
        cache = cache.advance(T) if cache is not None else None
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(cache.positions if cache is not None else torch.arange(T, device=idx.device))
        ve = [self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None for i in range(len(self.blocks))]
        x = self.trunk(self.drop(x), cache, ve)  # (B, T, C)
        logits = self.scaled(self.lm_head(x[:, -1:] if last else x))  # (B, T, vocab)
        return logits, None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)),
                                                                    targets.reshape(-1), ignore_index=-1)


class ViT(Trunk, nn.Module):
    """Image classifier (Dosovitskiy et al.; the ViT of [Oh] Sec. 4.1 and [OViT]): non-overlapping patches linearly
    embedded, a [CLS] token, learned 1-D position embeddings, the same trunk without a causal mask, and a linear head
    on the [CLS] output. Global orthogonal mode is the plain per-sample projection here ([Oh] Alg. 2)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        d, p = config.n_embd, config.patch_size
        self.patch_embed = nn.Conv2d(config.channels, d, kernel_size=p, stride=p)  # a Linear on each patch
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_emb = nn.Parameter(torch.zeros(1, (config.image_size // p) ** 2 + 1, d))
        self.drop = nn.Dropout(config.dropout)
        self.build_trunk(config, causal=False, n_out=config.n_classes)
        self.head = nn.Linear(d, config.n_classes)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """'gpt2': N(0, 0.02) throughout (as timm's ViT). 'sigma': unit-variance patch embeddings for unit-variance
        pixels, the analogue of [OT]'s token embeddings; blocks: Block.init_weights."""
        cfg = self.config
        fan_in = cfg.channels * cfg.patch_size ** 2
        self.patch_embed.weight.normal_(0.0, 1 / math.sqrt(fan_in) if cfg.init == 'sigma' else 0.02)
        self.patch_embed.bias.zero_()
        for t in (self.cls_token, self.pos_emb, self.head.weight):
            t.normal_(0.0, 0.02)
        self.head.bias.zero_()
        for block in self.blocks:
            block.init_weights(cfg)
        self.after_step()

    def own_stream_matrices(self):
        return [(self.head.weight, -1)]  # the patch embedding, a convolution, is left as it is

    def forward(self, images, labels=None):
        """images (B, C, H, W) float -> logits (B, n_classes), and the cross-entropy if labels are given: class
        indices (B,) or class probabilities (B, n_classes), as mixup makes."""
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, N, C)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_emb
        logits = self.scaled(self.head(self.trunk(self.drop(x))[:, 0]))  # (B, n_classes)
        return logits, None if labels is None else F.cross_entropy(logits, labels,
                                                                   label_smoothing=self.config.label_smoothing)
