"""RWKV6, chunked: forward and backward Triton kernels over chunks of BT = 64 tokens.

Per (batch, head), with state S of shape [K, V]:
    o_t = scale * r_t (S_{t-1} + diag(u) k_t^T v_t)
    S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t

Inside chunk c (rows i, j = 0..BT-1), with h_c the state entering it,
pre_i = sum_{s < i} w_s, suf_j = sum_{s > j} w_s and tot = sum_s w_s (sums
over the chunk):
    o_i = scale * ((r_i * exp(pre_i)) h_c + sum_{j <= i} A_ij v_j)
    A_ij = sum_d r_id k_jd exp(sum_{j < s < i} w_sd)   (j < i),   A_ii = sum_d r_id u_d k_id
    h_{c+1} = diag(exp(tot)) h_c + (k * exp(suf))^T v
A is built from sub-chunks of BC = 16 rows. The block of rows I and columns
J < I is the product (r_I * exp(pre_I)) (k_J * exp(suf_J + between))^T, with
pre_I, suf_J the gate sums inside the sub-chunks I, J and `between` the sums
of the sub-chunks between them; diagonal blocks are summed element-wise with
exponent pre_i - pre_{j+1} inside one sub-chunk. Every other exponent is a sum
of non-positive stored gate sums (see ops/common/chunk_state.py), never a
difference of two chunk-wide cumulative sums: nothing overflows, and strong
decays keep their precision.

Forward:  block_gate_sums -> chunk_fwd_h (states) -> _intra_A_kernel (A)
          -> _fwd_o_kernel (o).
Backward: the gate sums, states and A are recomputed; chunk_bwd_dh (dh, dh0)
          -> _bwd_dA_kernel (dA) -> _bwd_dv_kernel (dv) -> _bwd_inter_kernel
          (the parts of dr, dk through the states entering / leaving the chunk,
          the boundary terms of dw) -> _bwd_intra_kernel (the intra-chunk parts,
          the gate-free terms, du partials) -> chunk_gate_grad (dw).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.chunk_state import (block_gate_sums, block_size, block_total,
                                                chunk_bwd_dh, chunk_fwd_h, chunk_gate_tiles,
                                                exp_nonpos, load_prefix, load_prefix_row,
                                                load_suffix)
from fla_kernels.ops.common.dot import mma
from fla_kernels.ops.common.gate_grad import chunk_gate_grad
from fla_kernels.utils import check_inputs, dots_in_fp32, store_dtype

BT = 64  # tokens per chunk
BC = 16  # tokens per sub-chunk of the intra-chunk products

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


# ----------------------------------------------------------------------------- tile helpers

@triton.jit
def _load_rows(x, base, t0, T, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
               BD: tl.constexpr, i_d):
    """[BR, BD] float32 tile of x [B, T, H, D] at rows t0.., columns i_d*BD.. (zero outside)."""
    t = t0 + tl.arange(0, BR)
    d = i_d * BD + tl.arange(0, BD)
    offs = base + t.to(tl.int64)[:, None] * (H * D) + d[None, :]
    return tl.load(x + offs, mask=(t[:, None] < T) & (d[None, :] < D), other=0).to(tl.float32)


@triton.jit
def _load_rows_t(x, base, t0, T, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
                 BD: tl.constexpr, i_d):
    """The same tile as `_load_rows`, read transposed: [BD, BR]."""
    t = t0 + tl.arange(0, BR)
    d = i_d * BD + tl.arange(0, BD)
    offs = base + t.to(tl.int64)[None, :] * (H * D) + d[:, None]
    return tl.load(x + offs, mask=(t[None, :] < T) & (d[:, None] < D), other=0).to(tl.float32)


@triton.jit
def _load_row(x, base, t, T, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, i_d):
    """[BD] float32 row of x [B, T, H, D] at time t (zero past T)."""
    d = i_d * BD + tl.arange(0, BD)
    # a scalar bool and'ed with a vector one trips the triton 3.9 interpreter: fold t < T into the bound
    m = d < tl.where(t < T, D, 0)
    return tl.load(x + base + t.to(tl.int64) * (H * D) + d, mask=m, other=0).to(tl.float32)


@triton.jit
def _store_rows(x, val, base, t0, T, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
                BD: tl.constexpr, i_d):
    """Store a [BR, BD] tile into x [B, T, H, D] at rows t0.., in x's dtype."""
    t = t0 + tl.arange(0, BR)
    d = i_d * BD + tl.arange(0, BD)
    offs = base + t.to(tl.int64)[:, None] * (H * D) + d[None, :]
    tl.store(x + offs, val.to(x.dtype.element_ty), mask=(t[:, None] < T) & (d[None, :] < D))


@triton.jit
def _load_state(s, index, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                i_k, i_v, TRANSPOSED: tl.constexpr):
    """[BK, BV] float32 block (or [BV, BK] with TRANSPOSED) of the [K, V] matrix number `index`."""
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    if TRANSPOSED:
        offs = o_k[None, :] * V + o_v[:, None]
        mask = (o_k[None, :] < K) & (o_v[:, None] < V)
    else:
        offs = o_k[:, None] * V + o_v[None, :]
        mask = (o_k[:, None] < K) & (o_v[None, :] < V)
    return tl.load(s + index * (K * V) + offs, mask=mask, other=0)


@triton.jit
def _score_block(A, i_bh, T, t0, c0, BR: tl.constexpr, BCOL: tl.constexpr, BT: tl.constexpr,
                 TRANSPOSED: tl.constexpr):
    """Pointers and mask of a block of a [B, H, T, BT] score buffer (lower triangle only).

    Rows are times t0 + i, columns positions c0 + j inside the chunk; the mask
    keeps rows before T on or below the diagonal (the rest is never written).
    With TRANSPOSED the block is [BCOL, BR]: element [j, i] is A[t0 + i, c0 + j].
    """
    if TRANSPOSED:
        t = t0 + tl.arange(0, BR)[None, :]
        col = c0 + tl.arange(0, BCOL)[:, None]
    else:
        t = t0 + tl.arange(0, BR)[:, None]
        col = c0 + tl.arange(0, BCOL)[None, :]
    ptrs = A + (i_bh * T + t.to(tl.int64)) * BT + col
    return ptrs, (t < T) & (col <= t % BT)


# ----------------------------------------------------------------------------- forward kernels

@triton.jit
def _between(P, base, c0, T, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, i_k,
             BC: tl.constexpr, J: tl.constexpr, I: tl.constexpr):
    """[BK] sum of the gate over the sub-chunks strictly between sub-chunks J and I."""
    b_sum = tl.zeros([BK], dtype=tl.float32)
    for i_s in tl.static_range(J + 1, I):
        b_sum += block_total(P, base, c0 + i_s * BC, T, H, K, BK, i_k, BC)
    return b_sum


@triton.jit(do_not_specialize=["T"])
def _intra_A_kernel(r, k, P, Q, u, A, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                    BC: tl.constexpr, BK: tl.constexpr, FP32_DOT: tl.constexpr,
                    OPERAND_DTYPE: tl.constexpr):
    """A [B, H, T, BT] float32: the intra-chunk scores, on and below the diagonal.

    One program per (chunk, b*h) fills the [BC, BC] blocks (I, J <= I) of its
    chunk's [BT, BT] score matrix. Below the diagonal: a dot over K of
    r_I * exp(pre_I) and k_J * exp(suf_J + between), both exponents <= 0. On
    the diagonal: element-wise, one column j at a time (i > j), with exponent
    pre_i - pre_{j+1} inside the sub-chunk, plus the u bonus
    sum_d r_id u_d k_id at i = j.
    """
    i_c, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    base = (i_b * T * H + i_h) * K
    c0 = i_c * BT
    o_i = tl.arange(0, BC)
    NK = tl.cdiv(K, BK)
    for i_i in tl.static_range(BT // BC):
        t_i = c0 + i_i * BC
        for i_j in tl.static_range(i_i):
            t_j = c0 + i_j * BC
            b_A = tl.zeros([BC, BC], dtype=tl.float32)
            for i_k in range(NK):
                b_r = _load_rows(r, base, t_i, T, H, K, BC, BK, i_k)
                b_pre = load_prefix(P, base, t_i, T, H, K, BC, BK, i_k, BC, True)
                b_k = _load_rows(k, base, t_j, T, H, K, BC, BK, i_k)
                b_suf = load_suffix(Q, base, t_j, T, H, K, BC, BK, i_k)
                b_btw = _between(P, base, c0, T, H, K, BK, i_k, BC, i_j, i_i)
                b_rg = b_r * exp_nonpos(b_pre)
                b_kg = b_k * exp_nonpos(b_suf + b_btw[None, :])
                b_A += mma(b_rg, tl.trans(b_kg), FP32_DOT, OPERAND_DTYPE)
            p_A, m_A = _score_block(A, i_bh, T, t_i, i_j * BC, BC, BC, BT, False)
            tl.store(p_A, b_A, mask=m_A)
        b_A = tl.zeros([BC, BC], dtype=tl.float32)
        for i_k in range(NK):
            o_d = i_k * BK + tl.arange(0, BK)
            b_u = tl.load(u + i_h * K + o_d, mask=o_d < K, other=0).to(tl.float32)
            b_r = _load_rows(r, base, t_i, T, H, K, BC, BK, i_k)
            b_k = _load_rows(k, base, t_i, T, H, K, BC, BK, i_k)
            b_pre = load_prefix(P, base, t_i, T, H, K, BC, BK, i_k, BC, True)
            b_bonus = tl.sum(b_r * b_u[None, :] * b_k, axis=1)
            b_A += tl.where(o_i[:, None] == o_i[None, :], b_bonus[:, None], 0.0)
            for j in range(BC):
                b_kj = _load_row(k, base, t_i + j, T, H, K, BK, i_k)
                b_prej = load_prefix_row(P, base, t_i + j, T, H, K, BK, i_k, BC, False)
                b_s = b_r * b_kj[None, :] * exp_nonpos(b_pre - b_prej[None, :])
                b_col = tl.sum(tl.where(o_i[:, None] > j, b_s, 0.0), axis=1)
                b_A += tl.where(o_i[None, :] == j, b_col[:, None], 0.0)
        p_A, m_A = _score_block(A, i_bh, T, t_i, i_i * BC, BC, BC, BT, False)
        tl.store(p_A, b_A, mask=m_A)


@triton.jit(do_not_specialize=["T", "NT"])
def _fwd_o_kernel(r, v, P, Q, states, A, o, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                  V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """o = scale * ((r * exp(pre)) h_c + A v), one program per (V-block, chunk, b*h)."""
    i_v, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    base_k = (i_b * T * H + i_h) * K
    base_v = (i_b * T * H + i_h) * V
    c0 = i_c * BT
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_r = _load_rows(r, base_k, c0, T, H, K, BT, BK, i_k)
        b_pre, _, _ = chunk_gate_tiles(P, Q, base_k, c0, T, H, K, BT, BC, BK, i_k, True)
        b_h = _load_state(states, i_bh * (NT + 1) + i_c, K, V, BK, BV, i_k, i_v, False)
        b_o += mma(b_r * exp_nonpos(b_pre), b_h, FP32_DOT, OPERAND_DTYPE)
    p_A, m_A = _score_block(A, i_bh, T, c0, 0, BT, BT, BT, False)
    b_A = tl.load(p_A, mask=m_A, other=0)
    b_v = _load_rows(v, base_v, c0, T, H, V, BT, BV, i_v)
    b_o += mma(b_A, b_v, FP32_DOT, OPERAND_DTYPE)
    _store_rows(o, b_o * scale, base_v, c0, T, H, V, BT, BV, i_v)


# ----------------------------------------------------------------------------- backward kernels

@triton.jit(do_not_specialize=["T"])
def _bwd_dA_kernel(do, v, dA, scale, T, H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                   BV: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """dA [B, H, T, BT] float32 = scale * do v^T on and below the diagonal, per (chunk, b*h)."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    base_v = (i_b * T * H + i_h) * V
    c0 = i_c * BT
    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_do = _load_rows(do, base_v, c0, T, H, V, BT, BV, i_v)
        b_vt = _load_rows_t(v, base_v, c0, T, H, V, BT, BV, i_v)
        b_dA += mma(b_do, b_vt, FP32_DOT, OPERAND_DTYPE)
    p_dA, m_dA = _score_block(dA, i_bh, T, c0, 0, BT, BT, BT, False)
    tl.store(p_dA, b_dA * scale, mask=m_dA)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_dv_kernel(k, P, Q, A, do, dh, dv, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                   V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                   BV: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """dv = scale * A^T do + (k * exp(suf)) dh_c, per (V-block, chunk, b*h).

    dh_c is the gradient w.r.t. the state leaving chunk c.
    """
    i_v, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    base_k = (i_b * T * H + i_h) * K
    base_v = (i_b * T * H + i_h) * V
    c0 = i_c * BT
    p_At, m_At = _score_block(A, i_bh, T, c0, 0, BT, BT, BT, True)
    b_At = tl.load(p_At, mask=m_At, other=0)
    b_do = _load_rows(do, base_v, c0, T, H, V, BT, BV, i_v)
    b_dv = mma(b_At, b_do * scale, FP32_DOT, OPERAND_DTYPE)
    for i_k in range(tl.cdiv(K, BK)):
        b_k = _load_rows(k, base_k, c0, T, H, K, BT, BK, i_k)
        _, b_suf, _ = chunk_gate_tiles(P, Q, base_k, c0, T, H, K, BT, BC, BK, i_k, True)
        b_dh = _load_state(dh, i_bh * NT + i_c, K, V, BK, BV, i_k, i_v, False)
        b_dv += mma(b_k * exp_nonpos(b_suf), b_dh, FP32_DOT, OPERAND_DTYPE)
    _store_rows(dv, b_dv, base_v, c0, T, H, V, BT, BV, i_v)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_inter_kernel(k, v, P, Q, do, states, dh, drs, dks, dr_first, dk_last, boundary, scale,
                      T, NT,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                      BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """Parts of dr, dk through the chunk's entering / leaving states, per (K-block, chunk, b*h).

    drs = scale * exp(pre) * (do h_c^T) and dks = exp(suf) * (v dh_c^T), float32
    [B, T, H, K] (the intra kernel adds its parts in place), except for two
    rows whose path carries no gate: the chunk's first row reads h_c with
    pre = 0 (its drs goes to dr_first [B, H, NT, K]), and the last row L enters
    the leaving state as k_L^T v_L with suf_L = 0 (its dks goes to dk_last).
    boundary[b, h, c] = sum_v (h_{c+1} - k_L^T v_L) * dh_c, the boundary term of
    dw without that gate-free path (`_bwd_intra_kernel` says why both drop it).
    """
    i_k, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    base_k = (i_b * T * H + i_h) * K
    base_v = (i_b * T * H + i_h) * V
    c0 = i_c * BT
    is_first = (tl.arange(0, BT) == 0)[:, None]
    is_last = (c0 + tl.arange(0, BT) == tl.minimum(c0 + BT, T) - 1)[:, None]
    b_pre, b_suf, b_tot = chunk_gate_tiles(P, Q, base_k, c0, T, H, K, BT, BC, BK, i_k, True)
    b_decay = exp_nonpos(b_suf)
    # k * exp(suf) without row L: turns h_c into h_{c+1} - k_L^T v_L
    b_kd = tl.where(is_last, 0.0, _load_rows(k, base_k, c0, T, H, K, BT, BK, i_k) * b_decay)
    b_dr = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_bound = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_do = _load_rows(do, base_v, c0, T, H, V, BT, BV, i_v)
        b_v = _load_rows(v, base_v, c0, T, H, V, BT, BV, i_v)
        b_ht = _load_state(states, i_bh * (NT + 1) + i_c, K, V, BK, BV, i_k, i_v, True)
        b_dht = _load_state(dh, i_bh * NT + i_c, K, V, BK, BV, i_k, i_v, True)
        b_dr += mma(b_do, b_ht, FP32_DOT, OPERAND_DTYPE)
        b_dk += mma(b_v, b_dht, FP32_DOT, OPERAND_DTYPE)
        b_xt = b_ht * exp_nonpos(b_tot)[None, :] + mma(tl.trans(b_v), b_kd, FP32_DOT, OPERAND_DTYPE)
        b_bound += tl.sum(b_xt * b_dht, axis=0)
    b_dk *= b_decay
    o_d = i_k * BK + tl.arange(0, BK)
    tl.store(dk_last + (i_bh * NT + i_c) * K + o_d, tl.sum(tl.where(is_last, b_dk, 0.0), axis=0),
             mask=o_d < K)
    b_dr *= scale * exp_nonpos(b_pre)
    tl.store(dr_first + (i_bh * NT + i_c) * K + o_d, tl.sum(tl.where(is_first, b_dr, 0.0), axis=0),
             mask=o_d < K)
    _store_rows(drs, tl.where(is_first, 0.0, b_dr), base_k, c0, T, H, K, BT, BK, i_k)
    _store_rows(dks, tl.where(is_last, 0.0, b_dk), base_k, c0, T, H, K, BT, BK, i_k)
    tl.store(boundary + (i_bh * NT + i_c) * K + o_d, b_bound, mask=o_d < K)


@triton.jit
def _gather_rows(x, base, t, m_t, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, i_d):
    """[len(t), BD] float32 rows t of x [B, T, H, D] where m_t holds (zero elsewhere)."""
    d = i_d * BD + tl.arange(0, BD)
    offs = base + t.to(tl.int64)[:, None] * (H * D) + d[None, :]
    return tl.load(x + offs, mask=m_t[:, None] & (d[None, :] < D), other=0).to(tl.float32)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_intra_kernel(r, k, P, Q, u, dA, drs, dks, dr_first, dk_last, dr, dk, du_part, T, NT,
                      H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                      BK: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """Intra-chunk parts of dr, dk, the u bonus and du, per (K-block, chunk, b*h).

    dr_i += sum_{j < i} dA_ij k_j exp(w_{j+1} + ... + w_{i-1}) and
    dk_j += sum_{i > j} dA_ij r_i exp(w_{j+1} + ... + w_{i-1}): blocks off the
    sub-chunk diagonal as dots (exp(pre_I) factored out of the dr sums,
    exp(suf_J) out of the dk sums), diagonal blocks element-wise.

    dw comes from chunk_gate_grad, whose sums over the chunk cancel every term
    that carries no gate: the pair (i, j = i - 1) adds dA_ij r_i k_j through
    r_i dr_i and takes it away through k_j dk_j for every t <= j. Under strong
    decay those terms dominate dr and dk while dw is small (at w = -60 dw is
    about 1e-25), so summing them in float32 would cost dw its precision.
    drs, dks (float32, read by chunk_gate_grad) therefore hold the gradients
    through the states without the gate-free terms: the u bonus, the
    neighbour pairs, the first row's read of h_c (dr_first) and the last row's
    own path into the leaving state (dk_last, also taken out of the boundary
    term). dr and dk, in the inputs' dtype, add them back.
    du_part[b, c, h] = sum_i dA_ii r_i k_i.
    """
    i_k, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    base = (i_b * T * H + i_h) * K
    c0 = i_c * BT
    last = tl.minimum(c0 + BT, T) - 1
    o_i = tl.arange(0, BC)
    o_d = i_k * BK + tl.arange(0, BK)
    m_d = o_d < K
    b_u = tl.load(u + i_h * K + o_d, mask=m_d, other=0).to(tl.float32)
    b_dr_first = tl.load(dr_first + (i_bh * NT + i_c) * K + o_d, mask=m_d, other=0)
    b_dk_last = tl.load(dk_last + (i_bh * NT + i_c) * K + o_d, mask=m_d, other=0)
    # the neighbour pair (first row of I, last row of I - 1) sits in a corner of an off-diagonal block
    corner = (o_i[:, None] == 0) & (o_i[None, :] == BC - 1)
    corner_t = (o_i[:, None] == BC - 1) & (o_i[None, :] == 0)
    b_du = tl.zeros([BK], dtype=tl.float32)
    for i_i in tl.static_range(BT // BC):
        t_i = c0 + i_i * BC
        t = t_i + o_i
        b_r = _load_rows(r, base, t_i, T, H, K, BC, BK, i_k)
        b_k = _load_rows(k, base, t_i, T, H, K, BC, BK, i_k)
        b_pre = load_prefix(P, base, t_i, T, H, K, BC, BK, i_k, BC, True)
        b_prei = load_prefix(P, base, t_i, T, H, K, BC, BK, i_k, BC, False)
        b_suf = load_suffix(Q, base, t_i, T, H, K, BC, BK, i_k)
        p_dA = dA + (i_bh * T + t.to(tl.int64)) * BT
        b_dA_diag = tl.load(p_dA + (t - c0), mask=t < T, other=0)

        # dr of rows I through the state: blocks J < I, then the diagonal block
        b_dr = tl.zeros([BC, BK], dtype=tl.float32)
        for i_j in tl.static_range(i_i):
            t_j = c0 + i_j * BC
            p_blk, m_blk = _score_block(dA, i_bh, T, t_i, i_j * BC, BC, BC, BT, False)
            b_dA = tl.load(p_blk, mask=m_blk, other=0)
            if i_j == i_i - 1:
                b_dA = tl.where(corner, 0.0, b_dA)
            b_kj = _load_rows(k, base, t_j, T, H, K, BC, BK, i_k)
            b_sufj = load_suffix(Q, base, t_j, T, H, K, BC, BK, i_k)
            b_btw = _between(P, base, c0, T, H, K, BK, i_k, BC, i_j, i_i)
            b_dr += mma(b_dA, b_kj * exp_nonpos(b_sufj + b_btw[None, :]), FP32_DOT, OPERAND_DTYPE)
        b_dr *= exp_nonpos(b_pre)
        for j in range(BC):
            b_dA_col = tl.load(p_dA + i_i * BC + j, mask=(t < T) & (o_i > j + 1), other=0)
            b_k_row = _load_row(k, base, t_i + j, T, H, K, BK, i_k)
            b_prej = load_prefix_row(P, base, t_i + j, T, H, K, BK, i_k, BC, False)
            b_dr += b_dA_col[:, None] * b_k_row[None, :] * exp_nonpos(b_pre - b_prej[None, :])

        # dk of rows J = I through the state: blocks I' > J, then the diagonal block
        b_dk = tl.zeros([BC, BK], dtype=tl.float32)
        for i_l in tl.static_range(i_i + 1, BT // BC):
            t_l = c0 + i_l * BC
            p_blk, m_blk = _score_block(dA, i_bh, T, t_l, i_i * BC, BC, BC, BT, True)
            b_dAt = tl.load(p_blk, mask=m_blk, other=0)
            if i_l == i_i + 1:
                b_dAt = tl.where(corner_t, 0.0, b_dAt)
            b_rl = _load_rows(r, base, t_l, T, H, K, BC, BK, i_k)
            b_prel = load_prefix(P, base, t_l, T, H, K, BC, BK, i_k, BC, True)
            b_btw = _between(P, base, c0, T, H, K, BK, i_k, BC, i_i, i_l)
            b_dk += mma(b_dAt, b_rl * exp_nonpos(b_prel + b_btw[None, :]), FP32_DOT, OPERAND_DTYPE)
        b_dk *= exp_nonpos(b_suf)
        for i in range(BC):
            p_row = dA + (i_bh * T + (t_i + i).to(tl.int64)) * BT + i_i * BC + o_i
            b_dA_row = tl.load(p_row, mask=o_i < tl.where(t_i + i < T, i - 1, 0), other=0)
            b_ri = _load_row(r, base, t_i + i, T, H, K, BK, i_k)
            b_prei_row = load_prefix_row(P, base, t_i + i, T, H, K, BK, i_k, BC, True)
            b_dk += b_dA_row[:, None] * b_ri[None, :] * exp_nonpos(b_prei_row[None, :] - b_prei)

        b_drs = _load_rows(drs, base, t_i, T, H, K, BC, BK, i_k) + b_dr
        b_dks = _load_rows(dks, base, t_i, T, H, K, BC, BK, i_k) + b_dk
        _store_rows(drs, b_drs, base, t_i, T, H, K, BC, BK, i_k)
        _store_rows(dks, b_dks, base, t_i, T, H, K, BC, BK, i_k)

        # the gate-free terms: neighbour pairs, the u bonus, the last row's own path
        m_prev = (t > c0) & (t < T)
        b_dA_prev = tl.load(p_dA + (t - 1 - c0), mask=m_prev, other=0)
        b_dr_free = b_dA_prev[:, None] * _gather_rows(k, base, t - 1, m_prev, H, K, BK, i_k)
        b_dr_free += tl.where((t == c0)[:, None], b_dr_first[None, :], 0.0)
        m_next = t < last
        b_dA_next = tl.load(p_dA + BT + (t - c0), mask=m_next, other=0)
        b_dk_free = b_dA_next[:, None] * _gather_rows(r, base, t + 1, m_next, H, K, BK, i_k)
        b_dk_free += tl.where((t == last)[:, None], b_dk_last[None, :], 0.0)
        b_bonus = b_dA_diag[:, None] * b_u[None, :]
        _store_rows(dr, b_drs + b_dr_free + b_bonus * b_k, base, t_i, T, H, K, BC, BK, i_k)
        _store_rows(dk, b_dks + b_dk_free + b_bonus * b_r, base, t_i, T, H, K, BC, BK, i_k)
        b_du += tl.sum(b_dA_diag[:, None] * b_r * b_k, axis=0)
    tl.store(du_part + ((i_b * NT + i_c) * H + i_h) * K + o_d, b_du, mask=m_d)


# ----------------------------------------------------------------------------- launchers

class _Launch:
    """Shapes, block sizes and dot settings shared by the launches of one call."""

    def __init__(self, r, v):
        self.B, self.T, self.H, self.K = r.shape
        self.V = v.shape[-1]
        self.NT = triton.cdiv(self.T, BT)
        self.BK, self.BV = block_size(self.K), block_size(self.V)
        self.NK, self.NV = triton.cdiv(self.K, self.BK), triton.cdiv(self.V, self.BV)
        self.dots = dict(FP32_DOT=dots_in_fp32(r.dtype), OPERAND_DTYPE=_TL_DTYPES[r.dtype])


def _intra_scores(L, r, k, gates, u):
    """A [B, H, T, BT] float32 (only its lower triangle is meaningful)."""
    A = torch.empty(L.B, L.H, L.T, BT, dtype=torch.float32, device=r.device)
    _intra_A_kernel[(L.NT, L.B * L.H)](r, k, *gates, u, A, L.T, L.H, L.K, BT=BT, BC=BC, BK=L.BK,
                                       **L.dots)
    return A


def _states(L, k, v, gates, initial_state):
    """[B, H, NT + 1, K, V] float32: the state entering each chunk, then the final state."""
    return chunk_fwd_h(k, v, gates, initial_state, BT, BC, L.dots["FP32_DOT"], L.dots["OPERAND_DTYPE"])


def _forward(r, k, v, w, u, scale, initial_state):
    """(o, states [B, H, NT + 1, K, V] float32 with the final state last)."""
    L = _Launch(r, v)
    gates = block_gate_sums(w, BC)
    states = _states(L, k, v, gates, initial_state)
    A = _intra_scores(L, r, k, gates, u)
    o = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=v.device)
    _fwd_o_kernel[(L.NV, L.NT, L.B * L.H)](
        r, v, *gates, states, A, o, scale, L.T, L.NT, L.H, L.K, L.V, BT=BT, BC=BC, BK=L.BK,
        BV=L.BV, **L.dots)
    return o.to(v.dtype), states


def _backward(r, k, v, w, u, scale, initial_state, do, dht):
    """(dr, dk, dv, dw, du, dh0 or None); dht may be None (no gradient from the final state)."""
    L = _Launch(r, v)
    grid_v, grid_k = (L.NV, L.NT, L.B * L.H), (L.NK, L.NT, L.B * L.H)
    gates = block_gate_sums(w, BC)
    states = _states(L, k, v, gates, initial_state)
    dh, dh0 = chunk_bwd_dh(r, gates, do, dht, scale, BT, BC, q_gate_exclusive=True,
                           need_dh0=initial_state is not None, fp32_dot=L.dots["FP32_DOT"],
                           operand_dtype=L.dots["OPERAND_DTYPE"])
    A = _intra_scores(L, r, k, gates, u)
    dA = torch.empty_like(A)
    _bwd_dA_kernel[(L.NT, L.B * L.H)](do, v, dA, scale, L.T, L.H, L.V, BT=BT, BV=L.BV, **L.dots)
    dv = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=v.device)
    _bwd_dv_kernel[grid_v](k, *gates, A, do, dh, dv, scale, L.T, L.NT, L.H, L.K, L.V,
                           BT=BT, BC=BC, BK=L.BK, BV=L.BV, **L.dots)
    drs = torch.empty(L.B, L.T, L.H, L.K, dtype=torch.float32, device=r.device)
    dks = torch.empty_like(drs)
    boundary = torch.empty(L.B, L.H, L.NT, L.K, dtype=torch.float32, device=r.device)
    dr_first, dk_last = torch.empty_like(boundary), torch.empty_like(boundary)
    _bwd_inter_kernel[grid_k](k, v, *gates, do, states, dh, drs, dks, dr_first, dk_last, boundary, scale,
                              L.T, L.NT, L.H, L.K, L.V, BT=BT, BC=BC, BK=L.BK, BV=L.BV, **L.dots)
    dr, dk = (torch.empty(x.shape, dtype=store_dtype(x.dtype), device=x.device) for x in (r, k))
    du_part = torch.empty(L.B, L.NT, L.H, L.K, dtype=torch.float32, device=r.device)
    _bwd_intra_kernel[grid_k](r, k, *gates, u, dA, drs, dks, dr_first, dk_last, dr, dk, du_part,
                              L.T, L.NT, L.H, L.K, BT=BT, BC=BC, BK=L.BK, **L.dots)
    dw = chunk_gate_grad(r, drs, k, dks, boundary, BT, q_reads_current=False, out_dtype=store_dtype(w.dtype))
    du = du_part.sum(dim=(0, 1)).to(u.dtype)
    return dr.to(r.dtype), dk.to(k.dtype), dv.to(v.dtype), dw.to(w.dtype), du, dh0


class ChunkRWKV6Function(torch.autograd.Function):
    """Autograd wrapper: saves only the inputs; backward recomputes states and scores."""

    @staticmethod
    def forward(ctx, r, k, v, w, u, scale, initial_state, output_final_state):
        o, states = _forward(r, k, v, w, u, scale, initial_state)
        final_state = states[:, :, -1].clone() if output_final_state else None
        ctx.save_for_backward(r, k, v, w, u, initial_state)
        ctx.scale = scale
        ctx.output_final_state = output_final_state
        return o, final_state

    @staticmethod
    def backward(ctx, do, dht):
        r, k, v, w, u, initial_state = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(v)
        do = do.contiguous()
        if dht is not None and ctx.output_final_state:
            dht = dht.contiguous()
        else:
            dht = None
        dr, dk, dv, dw, du, dh0 = _backward(r, k, v, w, u, ctx.scale, initial_state, do, dht)
        if dh0 is not None:
            dh0 = dh0.to(initial_state.dtype)
        grads = (dr, dk, dv, dw, du, None, dh0, None)
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad))


def chunk_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False):
    """Chunked RWKV6: returns (o [B, T, H, V] in the inputs' dtype, final state [B, H, K, V] float32 or None).

    r, k, w: [B, T, H, K]; v: [B, T, H, V]; u: [H, K]; w is the log decay (<= 0);
    scale defaults to K ** -0.5; initial_state: [B, H, K, V] float32 or None.
    Differentiable in r, k, v, w, u and initial_state.
    """
    if not isinstance(r, torch.Tensor) or r.dim() != 4:
        raise ValueError("chunk_rwkv6: r must be a 4-D tensor [B, T, H, K].")
    if not isinstance(v, torch.Tensor) or v.dim() != 4:
        raise ValueError("chunk_rwkv6: v must be a 4-D tensor [B, T, H, V].")
    B, T, H, K = r.shape
    V = v.shape[-1]
    check_inputs("chunk_rwkv6", dict(r=r, k=k, v=v, w=w, u=u),
                 dict(r=(B, T, H, K), k=(B, T, H, K), v=(B, T, H, V), w=(B, T, H, K), u=(H, K)),
                 initial_state=initial_state, state_shape=(B, H, K, V))
    scale = K ** -0.5 if scale is None else float(scale)
    r, k, v, w, u = (x.contiguous() for x in (r, k, v, w, u))
    if initial_state is not None:
        initial_state = initial_state.contiguous()
    return ChunkRWKV6Function.apply(r, k, v, w, u, scale, initial_state, bool(output_final_state))
