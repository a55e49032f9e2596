"""Fused Triton kernels of the wide streams' two passes: hc_kernels='triton' (and 'auto' on CUDA).

The rules in model.py (HyperConnection, ManifoldHyperConnection) are the definition; this module is another
implementation of their prepare and forward, as FlashAttention is of attention's arithmetic, which the tests hold to
the rules' values and gradients (tests/kernels/test_hc_kernels.py, on a CPU under TRITON_INTERPRET=1). A sublayer
passes over its stream H (N, n, d) of N tokens twice:

  read   (prepare) one read of H: the coefficient products z and the norm's statistics together (mHC: vec(H) phi and
         the RMSNorm's sum of squares; HC: each copy's LayerNorm statistics and product with [W_alpha | W_beta]),
         the read weights from z, and the branch input h = sum_i read[i] H_i from the same rows again (a cache hit)
  write  (forward) H_j <- sum_i mixing[j, i] H_i + write[j] u: one read of H and u, one write

and backward mirrors them: the write's in one pass (the gradients of H, u and the per-token coefficients), the
read's in one kernel (the read weights' gradient, then the gradient of H through the products and the norm) and one
product over the tokens for the weights (X^T Y). Sinkhorn-Knopp runs per token in registers, its backward
recomputing its rounds. Left to torch, on per-token tensors of n or n x n values: the write and mixing maps from z
(sigmoid, tanh, the gates), mHC-lite's convex combination of permutations and the Cayley map's batched inverse; they
move about 1% of the stream's bytes. Everything accumulates in float32; the copies are read and written in the
stream's dtype (bfloat16 under autocast, model.stream_dtype). Each kernel is a torch custom op, which torch.compile
and CUDA graphs take whole. hc_kernels='auto' runs them for a shape class once they have passed a proof against the
rule's PyTorch on its device (verdict), and the rule's PyTorch for the shapes they do not fit or fail."""

import logging
import os
import warnings

import numpy as np
import torch
import triton
import triton.language as tl
from torch.utils._python_dispatch import _disable_current_modes

import model

# Tile sizes: not tuned on a GPU yet (docs/performance.md). The reads take more tokens, so that each program's
# share of the weight's reads (phi is n d x m) is small beside the stream's.
BLOCK_N = 16  # tokens a program takes (tl.dot's smallest tile side)
BLOCK_K = 64  # features of the flattened stream vec(H) a product reads at a time
BLOCK_D = 64  # features of each copy a program reads at a time
READ_N = {0: 32, 1: 64, 2: 32}  # tokens a read's program takes, by NORM: n d-wide rows for RMS, n rows of d else
NONE, RMS, LAYERNORM = 0, 1, 2  # the read's products: none (static weights), mHC's, HC's
# the same in the kernels: a GPU's Triton compiler reads only constexpr globals (the interpreter reads any)
NONE_, RMS_, LAYERNORM_ = map(tl.constexpr, (NONE, RMS, LAYERNORM))


def interpreting():  # Triton's interpreter, which runs the kernels on CPU tensors (tests)
    return os.environ.get('TRITON_INTERPRET') == '1'


def interpreter_fault():
    """Why Triton's interpreter cannot run the kernels beside this numpy, or None: before Triton 3.7 it reads a loop's
    integer bound as int() of a one-element array, which numpy 2.4 refuses (torch 2.11's CUDA build pins Triton 3.6)."""
    version = lambda v: tuple(int(x) for x in v.split('.')[:2])  # noqa: E731
    if version(triton.__version__) < (3, 7) and version(np.__version__) >= (2, 4):
        return (f"Triton {triton.__version__}'s interpreter cannot run the kernels beside numpy {np.__version__} (it "
                f"takes int() of one-element arrays, which numpy 2.4 refuses): pip install 'triton>=3.7' or "
                f"'numpy<2.4'")
    return None


def pow2(x, least=1):
    return max(least, triton.next_power_of_2(x))


# ----------------------------------------------------------------------------- the kernels

@triton.jit
def _tokens(BN: tl.constexpr):
    """This program's BN token indices, in 64 bits: offsets such as t n d outgrow 32 bits on large batches."""
    return tl.program_id(0).to(tl.int64) * BN + tl.arange(0, BN)


@triton.jit
def _flat(ptr, t, k, N, K):
    """Features k of the flattened rows t of (N, K), as float32, and the mask."""
    mask = (t < N)[:, None] & (k < K)[None, :]
    return tl.load(ptr + t[:, None] * K + k[None, :], mask=mask, other=0.0).to(tl.float32), mask


@triton.jit
def _tile(ptr, t, d0, N, d, n: tl.constexpr, NP: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    """The copies of BN tokens t at features d0.. of a stream (N, n, d), as float32 (BN, NP, BD) and its mask."""
    i = tl.arange(0, NP)
    k = d0 + tl.arange(0, BD)
    mask = (t < N)[:, None, None] & (i < n)[None, :, None] & (k < d)[None, None, :]
    x = tl.load(ptr + t[:, None, None] * (n * d) + i[None, :, None] * d + k[None, None, :], mask=mask, other=0.0)
    return x.to(tl.float32), mask


@triton.jit
def _copy(ptr, t, i, k, N, d, n: tl.constexpr):
    """Features k of copy i of tokens t of a stream (N, n, d), as float32 (BN, BK)."""
    return tl.load(ptr + t[:, None] * (n * d) + i * d + k[None, :], mask=(t < N)[:, None] & (k < d)[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _tanh(x):  # as e^(-2|x|), which cannot overflow
    e = tl.exp(-2 * tl.abs(x))
    return tl.where(x < 0, -1.0, 1.0) * (1 - e) / (1 + e)


@triton.jit
def _column(z, c, j):
    """Column j of z (..., C) as (...), c = tl.arange(0, C)."""
    return tl.sum(tl.where(c == j, z, 0.0), axis=-1)


@triton.jit
def _read_kernel(H, h, Z, S1, S2, PRE, W, C, E, A, B, N, d, m, eps, s_pre_t, s_pre_i,
                 n: tl.constexpr, NP: tl.constexpr, MP: tl.constexpr, NORM: tl.constexpr, PRECISION: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr):
    """h = sum_i read[i] H_i per token, read from the products z of the same pass (NORM RMS or LAYERNORM), written to
    Z with the statistics (S1: RMS's r; LAYERNORM's mean, S2 its 1/std) and the read weights to PRE; or (NONE) read
    given in PRE with strides s_pre_t, s_pre_i."""
    t = _tokens(BN)
    i = tl.arange(0, NP)
    c = tl.arange(0, MP)
    if NORM == RMS_:  # z = (vec(H) phi) r, r = 1 / sqrt(mean(vec(H)^2) + eps); phi (n d, m)
        acc = tl.zeros((BN, MP), tl.float32)
        ss = tl.zeros((BN,), tl.float32)
        for k0 in range(0, n * d, BK):
            k = k0 + tl.arange(0, BK)
            x, mask = _flat(H, t, k, N, n * d)
            w = tl.load(W + k[:, None] * m + c[None, :], mask=(k < n * d)[:, None] & (c < m)[None, :], other=0.0)
            acc += tl.dot(x, w, input_precision=PRECISION)
            ss += tl.sum(x * x, axis=1)
        r = tl.rsqrt(ss / (n * d) + eps)
        z = acc * r[:, None]
        tl.store(Z + t[:, None] * m + c[None, :], z, mask=(t < N)[:, None] & (c < m)[None, :])
        tl.store(S1 + t, r, mask=t < N)
        zp = tl.sum(tl.where(c[None, None, :] == i[None, :, None], z[:, None, :], 0.0), axis=2)  # z[:, :n]
        pre = tl.sigmoid(tl.load(A) * zp + tl.load(B + i, mask=i < n, other=0.0)[None, :])  # H_pre
    elif NORM == LAYERNORM_:  # per copy: z = LayerNorm(H_i) W = rho (H_i W' - mean c) + e; W' (d, m)
        acc = tl.zeros((BN * NP, MP), tl.float32)
        count = tl.zeros((BN, NP), tl.float32)
        mean = tl.zeros((BN, NP), tl.float32)
        m2 = tl.zeros((BN, NP), tl.float32)
        for d0 in range(0, d, BD):
            x, mask = _tile(H, t, d0, N, d, n, NP, BN, BD)
            k = d0 + tl.arange(0, BD)
            w = tl.load(W + k[:, None] * m + c[None, :], mask=(k < d)[:, None] & (c < m)[None, :], other=0.0)
            acc += tl.dot(tl.reshape(x, (BN * NP, BD)), w, input_precision=PRECISION)
            nb = tl.minimum(d - d0, BD).to(tl.float32)  # the chunk's mean and squares merged (Chan, Golub, LeVeque)
            cm = tl.sum(x, axis=2) / nb
            cm2 = tl.sum(tl.where(mask, (x - cm[:, :, None]) * (x - cm[:, :, None]), 0.0), axis=2)
            delta = cm - mean
            total = count + nb
            mean += delta * nb / total
            m2 += cm2 + delta * delta * count * nb / total
            count = total
        rho = tl.rsqrt(m2 / d + eps)
        cv = tl.load(C + c, mask=c < m, other=0.0)
        ev = tl.load(E + c, mask=c < m, other=0.0)
        z = rho[:, :, None] * (tl.reshape(acc, (BN, NP, MP)) - mean[:, :, None] * cv[None, None, :]) + ev[None, None, :]
        zmask = (t < N)[:, None, None] & (i < n)[None, :, None] & (c < m)[None, None, :]
        tl.store(Z + t[:, None, None] * (n * m) + i[None, :, None] * m + c[None, None, :], z, mask=zmask)
        smask = (t < N)[:, None] & (i < n)[None, :]
        tl.store(S1 + t[:, None] * n + i[None, :], mean, mask=smask)
        tl.store(S2 + t[:, None] * n + i[None, :], rho, mask=smask)
        pre = tl.load(A) * _tanh(_column(z, c[None, None, :], 0)) + \
            tl.load(B + i, mask=i < n, other=0.0)[None, :]  # A_m
    else:
        pre = tl.load(PRE + t[:, None] * s_pre_t + i[None, :] * s_pre_i, mask=(t < N)[:, None] & (i < n)[None, :],
                      other=0.0).to(tl.float32)
    if NORM != NONE_:
        tl.store(PRE + t[:, None] * n + i[None, :], pre, mask=(t < N)[:, None] & (i < n)[None, :])
    for d0 in range(0, d, BD):  # the branch's input from the rows just read
        k = d0 + tl.arange(0, BD)
        out = tl.zeros((BN, BD), tl.float32)
        for j in tl.static_range(n):
            out += _column(pre, i[None, :], j)[:, None] * _copy(H, t, j, k, N, d, n)
        tl.store(h + t[:, None] * d + k[None, :], out.to(h.dtype.element_ty), mask=(t < N)[:, None] & (k < d)[None, :])


@triton.jit
def _read_backward_kernel(H, dh, dH, dZ, Z, S1, S2, PRE, dPRE, W, C, E, A, N, d, m, s_pre_t, s_pre_i,
                          n: tl.constexpr, NP: tl.constexpr, MP: tl.constexpr, NORM: tl.constexpr,
                          PRECISION: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr):
    """The read's backward: dPRE = <dh, H_i> (the read weights' gradient, per token), then into dZ the gradient of
    the products z (dZ's own, from the maps of write and mixing, plus the read weights'), then dH = read[i] dh +
    the products' and the norm's gradient."""
    t = _tokens(BN)
    i = tl.arange(0, NP)
    c = tl.arange(0, MP)
    tmask = (t < N)[:, None] & (i < n)[None, :]
    pre = tl.load(PRE + t[:, None] * s_pre_t + i[None, :] * s_pre_i, mask=tmask, other=0.0).to(tl.float32)
    dpre = tl.zeros((BN, NP), tl.float32)
    for d0 in range(0, d, BD):
        k = d0 + tl.arange(0, BD)
        g = tl.load(dh + t[:, None] * d + k[None, :], mask=(t < N)[:, None] & (k < d)[None, :], other=0.0)
        for j in tl.static_range(n):
            dpre += tl.where(i[None, :] == j, tl.sum(_copy(H, t, j, k, N, d, n) * g.to(tl.float32), axis=1)[:, None],
                             0.0)
    tl.store(dPRE + t[:, None] * n + i[None, :], dpre, mask=tmask)
    if NORM == RMS_:
        zmask = (t < N)[:, None] & (c < m)[None, :]
        z = tl.load(Z + t[:, None] * m + c[None, :], mask=zmask, other=0.0)
        g = tl.load(dZ + t[:, None] * m + c[None, :], mask=zmask, other=0.0)
        dzp = tl.load(A) * dpre * pre * (1 - pre)  # through H_pre = sigmoid(a z_pre + b)
        g += tl.sum(tl.where(c[None, None, :] == i[None, :, None], dzp[:, :, None], 0.0), axis=1)
        tl.store(dZ + t[:, None] * m + c[None, :], g, mask=zmask)
        r = tl.load(S1 + t, mask=t < N, other=0.0)
        q = r * r * tl.sum(g * z, axis=1) / (n * d)  # the RMSNorm's term: dx = r g phi^T - q x
    elif NORM == LAYERNORM_:
        zoff = t[:, None, None] * (n * m) + i[None, :, None] * m + c[None, None, :]
        zmask = (t < N)[:, None, None] & (i < n)[None, :, None] & (c < m)[None, None, :]
        z = tl.load(Z + zoff, mask=zmask, other=0.0)
        g = tl.load(dZ + zoff, mask=zmask, other=0.0)
        th = _tanh(_column(z, c[None, None, :], 0))
        g += tl.where(c[None, None, :] == 0, (tl.load(A) * dpre * (1 - th * th))[:, :, None], 0.0)  # through A_m
        tl.store(dZ + zoff, g, mask=zmask)
        mean = tl.load(S1 + t[:, None] * n + i[None, :], mask=tmask, other=0.0)
        rho = tl.load(S2 + t[:, None] * n + i[None, :], mask=tmask, other=0.0)
        cv = tl.load(C + c, mask=c < m, other=0.0)
        ev = tl.load(E + c, mask=c < m, other=0.0)
        q = rho * rho * tl.sum(g * (z - ev[None, None, :]), axis=2) / d  # dx = rho g W'^T - q (x - mean) - p
        p = rho * tl.sum(g * cv[None, None, :], axis=2) / d
    if NORM == LAYERNORM_:
        for d0 in range(0, d, BD):
            x, mask = _tile(H, t, d0, N, d, n, NP, BN, BD)
            k = d0 + tl.arange(0, BD)
            dhc = tl.load(dh + t[:, None] * d + k[None, :], mask=(t < N)[:, None] & (k < d)[None, :], other=0.0)
            w = tl.load(W + k[:, None] * m + c[None, :], mask=(k < d)[:, None] & (c < m)[None, :], other=0.0)
            back = tl.reshape(tl.dot(tl.reshape(g, (BN * NP, MP)), tl.trans(w), input_precision=PRECISION),
                              (BN, NP, BD))
            dx = pre[:, :, None] * dhc.to(tl.float32)[:, None, :] + rho[:, :, None] * back - \
                q[:, :, None] * (x - mean[:, :, None]) - p[:, :, None]
            tl.store(dH + t[:, None, None] * (n * d) + i[None, :, None] * d + k[None, None, :],
                     dx.to(dH.dtype.element_ty), mask=mask)
    else:  # over vec(H) (N, n d): feature k is copy k // d's feature k % d
        for k0 in range(0, n * d, BK):
            k = k0 + tl.arange(0, BK)
            x, mask = _flat(H, t, k, N, n * d)
            dhk = tl.load(dh + t[:, None] * d + (k % d)[None, :], mask=mask, other=0.0).to(tl.float32)
            prek = tl.load(PRE + t[:, None] * s_pre_t + (k // d)[None, :] * s_pre_i, mask=mask, other=0.0)
            dx = prek.to(tl.float32) * dhk
            if NORM == RMS_:
                w = tl.load(W + k[:, None] * m + c[None, :], mask=(k < n * d)[:, None] & (c < m)[None, :], other=0.0)
                dx += r[:, None] * tl.dot(g, tl.trans(w), input_precision=PRECISION) - q[:, None] * x
            tl.store(dH + t[:, None] * (n * d) + k[None, :], dx.to(dH.dtype.element_ty), mask=mask)


@triton.jit
def _xty_kernel(X, Y, G, R, K, m, rows_per_split, PRECISION: tl.constexpr, MP: tl.constexpr, BR: tl.constexpr,
                BK: tl.constexpr):
    """G[s] = X[rows of split s]^T Y[the same rows]: X (R, K) any float dtype, Y (R, m) float32, G (splits, K, MP)."""
    k = tl.program_id(0) * BK + tl.arange(0, BK)
    c = tl.arange(0, MP)
    first = tl.program_id(1).to(tl.int64) * rows_per_split
    acc = tl.zeros((BK, MP), tl.float32)
    for r0 in range(first, first + rows_per_split, BR):
        r = r0 + tl.arange(0, BR)
        rmask = (r < R) & (r < first + rows_per_split)
        x = tl.load(X + r[:, None] * K + k[None, :], mask=rmask[:, None] & (k < K)[None, :], other=0.0)
        y = tl.load(Y + r[:, None] * m + c[None, :], mask=rmask[:, None] & (c < m)[None, :], other=0.0)
        acc += tl.dot(tl.trans(x.to(tl.float32)), y, input_precision=PRECISION)
    tl.store(G + tl.program_id(1) * K * MP + k[:, None] * MP + c[None, :], acc, mask=(k < K)[:, None])


@triton.jit
def _write_kernel(H, U, RES, POST, OUT, N, d, s_res_t, s_res_j, s_res_i, s_post_t, s_post_j,
                  n: tl.constexpr, NP: tl.constexpr, HAS_RES: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    """OUT_j = sum_i RES[j, i] H_i + POST[j] U (RES absent: the identity), per token."""
    t = _tokens(BN)
    i = tl.arange(0, NP)
    tmask = t < N
    d0 = tl.program_id(1) * BD
    k = d0 + tl.arange(0, BD)
    x, mask = _tile(H, t, d0, N, d, n, NP, BN, BD)
    u = tl.load(U + t[:, None] * d + k[None, :], mask=tmask[:, None] & (k < d)[None, :], other=0.0).to(tl.float32)
    for j in tl.static_range(n):
        post = tl.load(POST + t * s_post_t + j * s_post_j, mask=tmask, other=0.0)
        if HAS_RES:
            res = tl.load(RES + t[:, None] * s_res_t + j * s_res_j + i[None, :] * s_res_i,
                          mask=tmask[:, None] & (i < n)[None, :], other=0.0)
            out = tl.sum(res[:, :, None] * x, axis=1)
        else:
            out = tl.sum(tl.where(i[None, :, None] == j, x, 0.0), axis=1)
        out += post[:, None] * u
        tl.store(OUT + t[:, None] * (n * d) + j * d + k[None, :], out.to(OUT.dtype.element_ty),
                 mask=tmask[:, None] & (k < d)[None, :])


@triton.jit
def _write_backward_kernel(dOUT, H, U, RES, POST, dH, dU, dRES, dPOST, N, d, s_res_t, s_res_j, s_res_i, s_post_t,
                           s_post_j, n: tl.constexpr, NP: tl.constexpr, HAS_RES: tl.constexpr, BN: tl.constexpr,
                           BD: tl.constexpr):
    """The write's backward per token: dH_i = sum_j RES[j, i] dOUT_j, dU = sum_j POST[j] dOUT_j, and the per-token
    dRES[j, i] = <dOUT_j, H_i>, dPOST[j] = <dOUT_j, U>."""
    t = _tokens(BN)
    i = tl.arange(0, NP)
    tmask = t < N
    dres = tl.zeros((BN, NP, NP), tl.float32)
    dpost = tl.zeros((BN, NP), tl.float32)
    for d0 in range(0, d, BD):
        k = d0 + tl.arange(0, BD)
        kmask = tmask[:, None] & (k < d)[None, :]
        x, mask = _tile(H, t, d0, N, d, n, NP, BN, BD)
        u = tl.load(U + t[:, None] * d + k[None, :], mask=kmask, other=0.0).to(tl.float32)
        dx = tl.zeros((BN, NP, BD), tl.float32)
        du = tl.zeros((BN, BD), tl.float32)
        for j in tl.static_range(n):
            g = tl.load(dOUT + t[:, None] * (n * d) + j * d + k[None, :], mask=kmask, other=0.0).to(tl.float32)
            post = tl.load(POST + t * s_post_t + j * s_post_j, mask=tmask, other=0.0)
            du += post[:, None] * g
            dpost += tl.where(i[None, :] == j, tl.sum(g * u, axis=1)[:, None], 0.0)
            if HAS_RES:
                res = tl.load(RES + t[:, None] * s_res_t + j * s_res_j + i[None, :] * s_res_i,
                              mask=tmask[:, None] & (i < n)[None, :], other=0.0)
                dx += res[:, :, None] * g[:, None, :]
                dres += tl.where(i[None, :, None] == j, tl.sum(g[:, None, :] * x, axis=2)[:, None, :], 0.0)
            else:
                dx += tl.where(i[None, :, None] == j, g[:, None, :], 0.0)
        tl.store(dH + t[:, None, None] * (n * d) + i[None, :, None] * d + k[None, None, :], dx.to(dH.dtype.element_ty),
                 mask=mask)
        tl.store(dU + t[:, None] * d + k[None, :], du.to(dU.dtype.element_ty), mask=kmask)
    nmask = tmask[:, None] & (i < n)[None, :]
    tl.store(dPOST + t[:, None] * n + i[None, :], dpost, mask=nmask)
    if HAS_RES:
        tl.store(dRES + t[:, None, None] * (n * n) + i[None, :, None] * n + i[None, None, :], dres,
                 mask=nmask[:, :, None] & (i < n)[None, None, :])


@triton.jit
def _sums(x, axis: tl.constexpr):
    """x's sums along axis (1: each column's, 2: each row's), kept as a dimension; 1 where there is nothing."""
    s = tl.sum(x, axis=axis)
    return tl.expand_dims(tl.where(s == 0, 1.0, s), axis)


@triton.jit
def _normalise(x, valid, axis: tl.constexpr):
    return tl.where(valid, x / _sums(x, axis), 0.0)


@triton.jit
def _sinkhorn_start(L, t, N, s_t, s_i, s_j, n: tl.constexpr, NP: tl.constexpr, BN: tl.constexpr):
    """exp(logits less their maximum) per token, (BN, NP, NP), 0 outside the n x n matrix; and that mask."""
    i = tl.arange(0, NP)
    valid = (t < N)[:, None, None] & (i < n)[None, :, None] & (i < n)[None, None, :]
    x = tl.load(L + t[:, None, None] * s_t + i[None, :, None] * s_i + i[None, None, :] * s_j, mask=valid,
                other=-float('inf'))
    top = tl.max(tl.max(x, axis=2), axis=1)
    top = tl.where(top == -float('inf'), 0.0, top)
    return tl.where(valid, tl.exp(x - top[:, None, None]), 0.0), valid


@triton.jit
def _sinkhorn_kernel(L, M, N, s_t, s_i, s_j, n: tl.constexpr, NP: tl.constexpr, ITERS: tl.constexpr,
                     BN: tl.constexpr):
    """model.sinkhorn per token: exp, then ITERS rounds of column then row normalisation; M (N, n, n)."""
    t = _tokens(BN)
    i = tl.arange(0, NP)
    x, valid = _sinkhorn_start(L, t, N, s_t, s_i, s_j, n, NP, BN)
    for _ in range(ITERS):
        x = _normalise(_normalise(x, valid, 1), valid, 2)
    tl.store(M + t[:, None, None] * (n * n) + i[None, :, None] * n + i[None, None, :], x, mask=valid)


@triton.jit
def _sinkhorn_backward_kernel(L, dM, dL, N, s_t, s_i, s_j, n: tl.constexpr, NP: tl.constexpr, ITERS: tl.constexpr,
                              SP: tl.constexpr, BN: tl.constexpr):
    """dL from dM: the forward rounds again, keeping each normalisation's sums (SP >= 2 ITERS slots of n); then
    back through them, last first, each normalisation's output y giving its input y s: y = x / s along an axis has
    dx = (dy - sum(dy y)) / s along it; and the exp, whose maximum is a constant."""
    t = _tokens(BN)
    i = tl.arange(0, NP)
    slot = tl.arange(0, SP)[None, :, None]
    x0, valid = _sinkhorn_start(L, t, N, s_t, s_i, s_j, n, NP, BN)
    sums = tl.zeros((BN, SP, NP), tl.float32)
    y = x0
    for q in range(ITERS):
        s = _sums(y, 1)  # (BN, 1, NP): each column's
        sums = tl.where(slot == 2 * q, s, sums)
        y = tl.where(valid, y / s, 0.0)
        s = _sums(y, 2)  # (BN, NP, 1): each row's
        sums = tl.where(slot == 2 * q + 1, tl.reshape(s, (BN, 1, NP)), sums)
        y = tl.where(valid, y / s, 0.0)
    off = t[:, None, None] * (n * n) + i[None, :, None] * n + i[None, None, :]
    g = tl.load(dM + off, mask=valid, other=0.0)
    for back in range(ITERS):
        q = ITERS - 1 - back
        s = tl.reshape(tl.sum(tl.where(slot == 2 * q + 1, sums, 0.0), axis=1), (BN, NP, 1))
        g = tl.where(valid, (g - tl.expand_dims(tl.sum(g * y, axis=2), 2)) / s, 0.0)
        y = y * s
        s = tl.expand_dims(tl.sum(tl.where(slot == 2 * q, sums, 0.0), axis=1), 1)
        g = tl.where(valid, (g - tl.expand_dims(tl.sum(g * y, axis=1), 1)) / s, 0.0)
        y = y * s
    tl.store(dL + off, g * x0, mask=valid)


# ----------------------------------------------------------------------------- the custom ops
# Inputs a mode does not use arrive as empty tensors and reach the kernels as None; outputs it does not fill are empty.

def precision():
    """tl.dot's arithmetic for float32 products: torch's own choice (torch.set_float32_matmul_precision)."""
    return 'ieee' if torch.get_float32_matmul_precision() == 'highest' else 'tf32'


def stages(H):
    """The read's software pipeline, in tiles of H: Triton's 3 deep, but 2 for a float32 stream with IEEE products,
    whose 3 tiles take 104 KiB of shared memory (76 KiB in TF32), more than a block has on a GPU of compute capability
    8.6 or 8.9 (99 KiB: RTX 30 and 40 series, A10, L4 and others)."""
    return 2 if H.element_size() == 4 and precision() == 'ieee' else 3


def given(t):
    return t if t.numel() else None


def f32(*shape, like):
    return torch.empty(shape, dtype=torch.float32, device=like.device)


def read_outputs(H, m, norm):
    """(h, z, read, S1, S2), empty: _read_kernel's outputs."""
    N, n, d = H.shape
    return (torch.empty(N, d, dtype=H.dtype, device=H.device),
            f32(N, m, like=H) if norm == RMS else f32(N, n, m, like=H) if norm == LAYERNORM else f32(0, like=H),
            f32(N, n, like=H) if norm != NONE else f32(0, like=H),
            f32(N, like=H) if norm == RMS else f32(N, n, like=H) if norm == LAYERNORM else f32(0, like=H),
            f32(N, n, like=H) if norm == LAYERNORM else f32(0, like=H))


@torch.library.custom_op('orthogpt::hc_read', mutates_args=())
def hc_read(H: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor, colsum: torch.Tensor, shift: torch.Tensor,
            a: torch.Tensor, b: torch.Tensor, norm: int, eps: float
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h (N, d), z, read weights (N, n), statistics S1, S2) for H (N, n, d) contiguous: _read_kernel. norm NONE:
    pre is the read (N, n), in any strides; RMS: weight is phi (n d, m); LAYERNORM: weight is W' (d, m), colsum its
    column sums, shift e. a, b: the read's map."""
    N, n, d = H.shape
    m = weight.shape[-1] if norm != NONE else 0
    h, z, read, s1, s2 = read_outputs(H, m, norm)
    weight, colsum, shift, a, b = (given(t.contiguous()) for t in (weight, colsum, shift, a, b))
    _read_kernel[(triton.cdiv(N, READ_N[norm]),)](
        H, h, given(z), given(s1), given(s2), pre if norm == NONE else read, weight, colsum, shift, a, b, N, d, m, eps,
        *(pre.stride() if norm == NONE else (n, 1)), n=n,
        NP=pow2(n), MP=pow2(m, 16), NORM=norm, PRECISION=precision(), BN=READ_N[norm], BK=BLOCK_K, BD=BLOCK_D,
        num_stages=stages(H))
    return h, z, read, s1, s2


@hc_read.register_fake
def _(H, pre, weight, colsum, shift, a, b, norm, eps):
    return read_outputs(H, weight.shape[-1] if norm != NONE else 0, norm)


@torch.library.custom_op('orthogpt::hc_read_backward', mutates_args=())
def hc_read_backward(dh: torch.Tensor, dz: torch.Tensor, H: torch.Tensor, z: torch.Tensor, s1: torch.Tensor,
                     s2: torch.Tensor, read: torch.Tensor, weight: torch.Tensor, colsum: torch.Tensor,
                     shift: torch.Tensor, a: torch.Tensor, norm: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dH, the read weights' gradient (N, n) per token, dz with the read weights' part added):
    _read_backward_kernel."""
    N, n, d = H.shape
    m = weight.shape[-1] if norm != NONE else 0
    dH, dread, dz_all = torch.empty_like(H), f32(N, n, like=H), f32(*dz.shape, like=H).copy_(dz)
    weight, colsum, shift, a = (given(t.contiguous()) for t in (weight, colsum, shift, a))
    _read_backward_kernel[(triton.cdiv(N, READ_N[norm]),)](
        H, dh.contiguous(), dH, given(dz_all), given(z), given(s1), given(s2), read, dread, weight, colsum, shift, a,
        N, d, m, *read.stride(), n=n, NP=pow2(n), MP=pow2(m, 16), NORM=norm,
        PRECISION=precision(), BN=READ_N[norm], BK=BLOCK_K, BD=BLOCK_D)
    return dH, dread, dz_all


@hc_read_backward.register_fake
def _(dh, dz, H, z, s1, s2, read, weight, colsum, shift, a, norm):
    return torch.empty_like(H), f32(*H.shape[:2], like=H), f32(*dz.shape, like=H)


@torch.library.custom_op('orthogpt::hc_xty', mutates_args=())
def hc_xty(X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """X^T Y, (K, m) float32, for X (R, K) of any float dtype and Y (R, m) float32: a weight's gradient, summed
    over the rows in parts (enough programs for a GPU) that are then added in a fixed order (deterministic)."""
    (R, K), m = X.shape, Y.shape[1]
    splits = max(1, min(64, R // 2048))
    G = f32(splits, K, pow2(m, 16), like=X)
    _xty_kernel[(triton.cdiv(K, 64), splits)](X.contiguous(), Y.contiguous(), G, R, K, m, triton.cdiv(R, splits),
                                              PRECISION=precision(), MP=G.shape[-1], BR=32, BK=64)
    return G.sum(0)[:, :m].contiguous()


@hc_xty.register_fake
def _(X, Y):
    return f32(X.shape[1], Y.shape[1], like=X)


@torch.library.custom_op('orthogpt::hc_write', mutates_args=())
def hc_write(H: torch.Tensor, u: torch.Tensor, res: torch.Tensor | None, post: torch.Tensor,
             dtype: torch.dtype) -> torch.Tensor:
    """sum_i res[j, i] H_i + post[j] u, (N, n, d) in dtype, for H (N, n, d) and u (N, d) contiguous; res (N, n, n)
    and post (N, n) in any strides (a static rule's expanded); res None: the identity."""
    N, n, d = H.shape
    out = torch.empty(N, n, d, dtype=dtype, device=H.device)
    _write_kernel[(triton.cdiv(N, BLOCK_N), triton.cdiv(d, BLOCK_D))](
        H, u, res, post, out, N, d, *(res.stride() if res is not None else (0, 0, 0)), *post.stride(), n=n,
        NP=pow2(n), HAS_RES=res is not None, BN=BLOCK_N, BD=BLOCK_D)
    return out


@hc_write.register_fake
def _(H, u, res, post, dtype):
    return torch.empty(H.shape, dtype=dtype, device=H.device)


@torch.library.custom_op('orthogpt::hc_write_backward', mutates_args=())
def hc_write_backward(dout: torch.Tensor, H: torch.Tensor, u: torch.Tensor, res: torch.Tensor | None,
                      post: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dH, du, dres (N, n, n) per token, empty for the identity, dpost (N, n) per token): _write_backward_kernel."""
    N, n, d = H.shape
    dH, du, dres, dpost = torch.empty_like(H), torch.empty_like(u), f32(N, n, n, like=H) if res is not None else \
        f32(0, like=H), f32(N, n, like=H)
    _write_backward_kernel[(triton.cdiv(N, BLOCK_N),)](
        dout.contiguous(), H, u, res, post, dH, du, given(dres), dpost, N, d,
        *(res.stride() if res is not None else (0, 0, 0)), *post.stride(), n=n, NP=pow2(n), HAS_RES=res is not None,
        BN=BLOCK_N, BD=BLOCK_D)
    return dH, du, dres, dpost


@hc_write_backward.register_fake
def _(dout, H, u, res, post):
    N, n, d = H.shape
    return (torch.empty_like(H), torch.empty_like(u), f32(N, n, n, like=H) if res is not None else f32(0, like=H),
            f32(N, n, like=H))


@torch.library.custom_op('orthogpt::hc_sinkhorn', mutates_args=())
def hc_sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """model.sinkhorn of float32 logits (N, n, n) in any strides, per token in registers: _sinkhorn_kernel."""
    N, n, _ = logits.shape
    out = f32(N, n, n, like=logits)
    _sinkhorn_kernel[(triton.cdiv(N, BLOCK_N),)](logits, out, N, *logits.stride(), n=n, NP=pow2(n), ITERS=iters,
                                                  BN=BLOCK_N)
    return out


@hc_sinkhorn.register_fake
def _(logits, iters):
    return f32(*logits.shape, like=logits)


@torch.library.custom_op('orthogpt::hc_sinkhorn_backward', mutates_args=())
def hc_sinkhorn_backward(dM: torch.Tensor, logits: torch.Tensor, iters: int) -> torch.Tensor:
    N, n, _ = logits.shape
    dL = f32(N, n, n, like=logits)
    _sinkhorn_backward_kernel[(triton.cdiv(N, BLOCK_N),)](logits, dM.contiguous(), dL, N, *logits.stride(), n=n,
                                                           NP=pow2(n), ITERS=iters, SP=pow2(2 * iters), BN=BLOCK_N)
    return dL


@hc_sinkhorn_backward.register_fake
def _(dM, logits, iters):
    return f32(*logits.shape, like=logits)


# ----------------------------------------------------------------------------- their gradients

def _read_setup(ctx, inputs, output):
    H, pre, weight, colsum, shift, a, b, norm, eps = inputs
    h, z, read, s1, s2 = output
    ctx.norm = norm
    ctx.save_for_backward(H, pre if norm == NONE else read, weight, colsum, shift, a, z, s1, s2)


def _read_grads(ctx, dh, dz, dread_out, ds1, ds2):
    H, read, weight, colsum, shift, a, z, s1, s2 = ctx.saved_tensors
    norm, n = ctx.norm, H.shape[1]
    dz = torch.zeros_like(z) if dz is None else dz
    dH, dread, dz = hc_read_backward(dh, dz, H, z, s1, s2, read, weight, colsum, shift, a, norm)
    if norm == NONE:
        return dH, dread, None, None, None, None, None, None, None
    if norm == RMS:  # read = sigmoid(a z[:, :n] + b); z = (vec(H) phi) r
        g = dread * read * (1 - read)
        da, db = (g * z[:, :n]).sum().view(1), g.sum(0)
        dweight, dcolsum, dshift = hc_xty(H.view(H.shape[0], -1), dz * s1[:, None]), None, None
    else:  # read = a tanh(z[..., 0]) + b; z = rho (H_i W' - mean c) + e per copy
        da, db = (dread * torch.tanh(z[..., 0])).sum().view(1), dread.sum(0)
        dweight = hc_xty(H.view(-1, H.shape[-1]), (dz * s2[..., None]).view(-1, dz.shape[-1]))
        dcolsum, dshift = -(dz * (s1 * s2)[..., None]).sum((0, 1)), dz.sum((0, 1))
    return dH, None, dweight, dcolsum, dshift, da, db, None, None


hc_read.register_autograd(_read_grads, setup_context=_read_setup)


def _write_setup(ctx, inputs, output):
    H, u, res, post, dtype = inputs
    ctx.has_res = res is not None
    ctx.save_for_backward(H, u, *((res,) if res is not None else ()), post)


def _write_grads(ctx, dout):
    H, u, *res, post = ctx.saved_tensors
    dH, du, dres, dpost = hc_write_backward(dout, H, u, res[0] if ctx.has_res else None, post)
    return dH, du, dres if ctx.has_res else None, dpost, None


hc_write.register_autograd(_write_grads, setup_context=_write_setup)


def _sinkhorn_setup(ctx, inputs, output):
    ctx.iters = inputs[1]
    ctx.save_for_backward(inputs[0])


def _sinkhorn_grads(ctx, dM):
    return hc_sinkhorn_backward(dM, ctx.saved_tensors[0], ctx.iters), None


hc_sinkhorn.register_autograd(_sinkhorn_grads, setup_context=_sinkhorn_setup)


def sinkhorn(logits, iters):
    """model.sinkhorn on the fused kernel: logits (..., n, n) in float32."""
    return hc_sinkhorn(logits.reshape(-1, *logits.shape[-2:]), iters).view(logits.shape)


# ----------------------------------------------------------------------------- which shapes they run

# The most copies n and columns of products m (z's: n + 2 for HC, 2n + n^2 for mHC, 2n + n! for mHC-lite) that the
# kernels take, compiled for compute capability 9.0 (docs/rules.md): beyond them a read needs more shared memory than
# a block of 8.6 or 8.9 has (99 KiB) and spills all but 32 registers a thread.
COPIES, COLUMNS = 8, 64
TOKENS = (2, 40)  # the proof's batch: 80 tokens, two programs of the widest read (READ_N), five of the write
# How far the proof lets the kernels' outputs and gradients lie from the rule's PyTorch's, relative to each one's
# largest entry, by the coarsest arithmetic of the shape class (docs/rules.md: 2.5-20x the gaps measured)
TOLERANCE = {'ieee': 1e-4, 'tf32': 2 ** -5, torch.float16: 2 ** -8, torch.bfloat16: 2 ** -5}
FALLBACK = "use hc_kernels='auto' (the rule's PyTorch where the kernels do not run) or 'torch'"
VERDICTS = {}  # shape class -> why the kernels do not run it, or None: decided once a process
log = logging.getLogger(__name__)


def native(device):
    """Whether Triton compiles the kernels for device (CUDA): where hc_kernels='auto' runs them."""
    return device.type == 'cuda'


def spec(rule, n):
    """The rule's shape class apart from width and dtypes, as constants, from what it hands the kernels (operands,
    twin): its class and twin, n copies, the kind of its read's products (None: static) and their columns m. A
    subclass is its own class: the proof builds it, so that one which changes the maths fails it, with the reason."""
    operands = rule.operands()
    kind, m = (None, 0) if operands is None else (operands[0], operands[1].shape[-1])
    return type(rule), rule.twin(), n, kind, m


def describe(spec, d, device, dtype, stream):
    """A shape class in the config's words, and the constructor's of its class (its twin) for the rest."""
    cls, twin, n, kind, m = spec
    name = next((f"residual='{k}'" for k, v in model.RESIDUALS.items() if v is cls), f"a {cls.__name__}")
    read, written = (str(t).removeprefix('torch.') for t in (dtype, stream))
    return (f"{name} (hc_rate={n}, {f'{m} {kind} products' if kind else 'static'}; "
            f"{cls.__name__}(d, {', '.join(map(repr, twin))})) at n_embd={d} on {device} in {read}"
            f"{f', written in {written}' if written != read else ''}")


def unfit(spec, device, dtype):
    """Why the kernels do not take this shape class at all, or None."""
    _, _, n, kind, m = spec
    if kind not in (None, 'rms', 'layernorm'):
        return f"the kernels compute the read's products as 'rms' or 'layernorm', not {kind!r}; use hc_kernels='torch'"
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"the kernels compute streams of float32, bfloat16 or float16, not {dtype}; use hc_kernels='torch'"
    if not native(device) and not interpreting():
        return (f"the kernels run on CUDA GPUs, not {device.type} (on a CPU under Triton's interpreter, "
                f"TRITON_INTERPRET=1, slowly: for tests); use hc_kernels='auto' or 'torch'")
    fault = None if native(device) else interpreter_fault()
    if fault:
        return fault
    if n > COPIES:
        return f"the kernels take {COPIES} copies at most, not hc_rate={n}; {FALLBACK}"
    if m > COLUMNS:
        return f"the read's kernels hold {COLUMNS} columns of products at most, and this rule has {m}; {FALLBACK}"
    return None


def verdict(strict, spec, d, device, dtype, stream):
    """Why the kernels do not run this shape class, or None where they do; strict ('triton') raises it instead. Decided
    once a process for each (spec, d's power-of-two bucket, device, the dtypes of x and of the stream, the float32
    products' arithmetic): refused where unfit (at debug level under 'auto'), else proved (a warning under 'auto'
    where the proof fails). Under torch.compile this runs as the graph is traced, on tensors of its own, and its
    answer is a constant of the graph: the proof never runs inside a compiled region."""
    key, shape = (spec, pow2(d), str(device), dtype, stream, precision()), (spec, d, device, dtype, stream)
    if key not in VERDICTS:
        why = unfit(spec, device, dtype)
        if why is None:
            failure = proof(*shape)
            if failure and not strict:
                warnings.warn(f"hc_kernels='auto' runs the rule's PyTorch for {describe(*shape)} from now on: the "
                              f"kernels failed their proof ({failure})", RuntimeWarning)
            why = failure and f"the kernels failed their proof ({failure}); {FALLBACK}"
        elif not strict:
            log.debug(f"hc_kernels='auto' runs the rule's PyTorch for {describe(*shape)}: {why}")
        VERDICTS[key] = why
    why = VERDICTS[key]
    if why and strict:
        raise ValueError(f"hc_kernels='triton' cannot run {describe(*shape)}: {why}")
    return why


# What torch.compiler.assume_constant_result(verdict) sets, and all it sets: dynamo calls verdict as it traces and
# holds its answer as a constant. Set here without importing torch._dynamo, which brings FSDP with it, where nothing
# compiles (sample.py, tests/unit/test_layout.py)
verdict._dynamo_marked_constant = True


def proof(spec, d, device, dtype, stream):
    """Why the kernels fail this shape class, or None: the rule of spec at width d, its parameters drawn away from
    their initial values, one forward and backward of TOKENS through the kernels and through its PyTorch, and every
    output and gradient of the kernels' within TOLERANCE of the PyTorch's; a compile or launch error fails it too. It
    leaves the run as it was: its own generator, and none of the caller's dispatch modes (train.py counts the first
    forward's FLOPs under one) or module hooks (it calls no module)."""
    cls, twin, n = spec[:3]
    g = torch.Generator().manual_seed(0)
    with _disable_current_modes(), torch.inference_mode(False), torch.enable_grad():
        try:
            rule = cls(d, *twin)
        except Exception as e:  # a subclass whose constructor takes other arguments than its twin() gives
            return f"{cls.__name__}(d, *twin()) cannot be built ({type(e).__name__}: {e}): override twin()"
        with torch.no_grad():
            for p in rule.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=g))
        H, u, *weights = (torch.randn(*TOKENS, *size, generator=g).to(device) for size in ((n, d), (d,), (n, d), (d,)))
        H, u, rule = H.to(dtype), u.to(stream), rule.to(device)
        try:
            fused = sublayer(rule, H, u, weights, stream, Fused(strict=True))
        except Exception as e:  # Triton's compiler, a launch, the driver: whatever stops the kernels
            return f"{type(e).__name__}: {(str(e).strip() or 'no message').splitlines()[0]}"
        plain = sublayer(rule, H, u, weights, stream, None)
    coarsest = next((t for t in (dtype, stream) if t != torch.float32), precision())
    for what, a, b in zip(('h', 'the next stream', 'dH', 'du', "the parameters' gradients"), fused, plain):
        error = ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()
        if not error <= TOLERANCE[coarsest]:  # NaN too
            return (f"{what} lies {error:.1e} of its largest entry from the rule's PyTorch's, more than "
                    f"{TOLERANCE[coarsest]:.1e}")
    return None


def sublayer(rule, H, u, weights, stream, fused):
    """(h, the next stream, the gradients of H and u, and the parameters' gradients as one vector) of one sublayer
    of rule, on the kernels (fused) or its PyTorch (None), in the stream's dtype, under a loss that weighs every
    output differently. One vector: a gate's gradient alone is a sum over every token, which cancels as float32
    cannot follow (docs/rules.md)."""
    H, u = H.detach().requires_grad_(), u.detach().requires_grad_()
    with torch.autocast(H.device.type, dtype=stream, enabled=stream != H.dtype):
        if fused is None:
            sub = model.Sublayer()
            h = rule.prepare(H, sub)
            out = rule.forward(H, u, sub)
        else:
            h, state = fused.prepare(rule, H)
            out = fused.forward(rule, H, u, state)
    loss = (out.float() * weights[0]).sum() + (h.float() * weights[1]).sum()
    dH, du, *grads = torch.autograd.grad(loss, [H, u, *rule.parameters()])
    return h, out, dH, du, torch.cat([g.flatten() for g in grads])


# ----------------------------------------------------------------------------- the rules' two passes

class Fused:
    """HyperConnection's and ManifoldHyperConnection's prepare and forward on the kernels above (model.KERNELS).
    strict: run wherever asked ('triton'), raising why not where they cannot; else ('auto') on CUDA only, and the
    rule's own PyTorch for a shape class they do not take or that fails their proof (verdict)."""

    def __init__(self, strict):
        self.strict = strict

    def takes(self, rule, x):
        """Whether the kernels run this sublayer on x: 'auto' runs them on CUDA alone (native), and each shape class
        where its verdict allows."""
        if not (self.strict or native(x.device)):
            return False
        return verdict(self.strict, spec(rule, x.shape[-2]), x.shape[-1], x.device, x.dtype,
                       model.stream_dtype(x)) is None

    def prepare(self, rule, x):
        """(h, (write, mixing)) of the rule's prepare, from its operands and maps alone."""
        H = x.reshape(-1, *x.shape[-2:]).contiguous()  # (N, n, d)
        N, n, d = H.shape
        none = H.new_empty(0, dtype=torch.float32)
        f32 = lambda t: t.float()  # noqa: E731  (weights stored in bfloat16, as FSDP's param_dtype does, read in float32)
        operands = rule.operands()
        with torch.autocast(x.device.type, enabled=False):
            if operands is None:
                read, write, mixing = rule.maps(None, sinkhorn)
                h = hc_read(H, f32(read).expand(N, n), none, none, none, none, none, NONE, 0.0)[0]
            else:
                kind, W, a, b, (gain, bias, eps) = operands
                if kind == 'rms':  # RMSNorm(vec(H)) W
                    h, z = hc_read(H, none, f32(W), none, none, f32(a), f32(b), RMS, eps)[:2]
                else:  # LayerNorm(H_i) W per copy: rho (H_i W' - mean c) + e; W' = diag(gain) W, c its column
                    # sums, e = bias W
                    weight = f32(gain)[:, None] * f32(W)
                    h, z = hc_read(H, none, weight, weight.sum(0), f32(bias) @ f32(W), f32(a), f32(b), LAYERNORM,
                                   eps)[:2]
                _, write, mixing = rule.maps(z.view(*x.shape[:-2], *z.shape[1:]), sinkhorn)
        return h.view(*x.shape[:-2], d), (f32(write), None if mixing is None else f32(mixing))

    def forward(self, rule, x, u, state):
        write, mixing = state
        H = x.reshape(-1, *x.shape[-2:]).contiguous()
        N, n, d = H.shape
        lead = x.shape[:-2]
        out = hc_write(H, u.reshape(N, d).contiguous(),
                       None if mixing is None else mixing.expand(*lead, n, n).reshape(N, n, n),
                       write.expand(*lead, n).reshape(N, n), model.stream_dtype(x))
        return out.view(x.shape)


model.KERNELS.update(triton=Fused(strict=True), auto=Fused(strict=False))
