"""The chunked pipeline shared by gla and rwkv6: forward and backward over chunks of BT = 64 tokens.

Both ops carry the state S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t per (batch, head); they differ only
in what the output reads, chosen by the constexpr READS_PREVIOUS:
    gla   (READS_PREVIOUS=False): o_t = scale * q_t S_t
    rwkv6 (READS_PREVIOUS=True):  o_t = scale * q_t (S_{t-1} + diag(u) k_t^T v_t)
(rwkv6's r is called q here, its w is g.)

Inside chunk c (rows i, j = 0..BT-1), with h_c the state entering it, pre_i the sum of g over the
chunk up to row i (inclusive for gla, exclusive for rwkv6), suf_j = sum_{s > j} g_s and tot the
chunk's total:
    o_i = scale * ((q_i * exp(pre_i)) h_c + sum_{j <= i} A_ij v_j)
    A_ij = sum_d q_id k_jd exp(pre_id - pre+_jd)   (j < i; pre+ the inclusive prefix)
    A_ii = sum_d q_id k_id (gla)   or   sum_d q_id u_d k_id (rwkv6)
    h_{c+1} = diag(exp(tot)) h_c + (k * exp(suf))^T v
A is built from sub-chunks of BC = 16 rows. Its block (I, J) left of the diagonal (J < I) is one
product (q_I * exp(pre_I)) (k_J * exp(to_J))^T, with pre_I the gates of I up to each row and to_J
the gates after each row of J up to the start of I: the reference point is the start of I, so
both exponents are <= 0.
The diagonal blocks are split the same way, recursively: the pairs of rows that first differ in
bit S of their block index are one small dot with the reference point between them
(`diag_level_sums`, four levels for BC = 16), so no exponent exceeds 0 there either. Every
exponent is a sum of the gates themselves over a span of rows, taken inside the kernel that needs
it as one masked product on the tensor cores (`span_sums`, see chunk_state.py), never a difference
of two cumulative sums: nothing overflows, strong decays keep their precision, and no gate sums
are stored.

Forward:  chunk_fwd_h (states) -> _intra_A_kernel (A) -> _fwd_o_kernel (o).
Backward: the states are recomputed, A is the forward's; chunk_bwd_dh (dh, dh0)
          -> _bwd_dA_kernel (dA) -> _bwd_dv_kernel (dv) -> _bwd_inter_kernel (the parts of dq, dk through the
          states entering / leaving the chunk, the boundary terms of dg) -> _bwd_intra_kernel (the
          intra-chunk parts, the gate-free terms, du partials) -> chunk_gate_grad (dg).
A packed batch (cu_seqlens) runs on its chunk-aligned row (ops/common/varlen.py): the two state
walks take its sequences' chunk offsets, every other kernel runs as it is.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.chunk_state import (chunk_bwd_dh, chunk_fwd_h, chunk_gate_sums,
                                                diag_level_sums, exp_nonpos, gates_after,
                                                gates_from, through_states)
from fla_kernels.ops.common.dot import mma, mma_split
from fla_kernels.ops.common.gate_grad import chunk_gate_grad
from fla_kernels.ops.common.launch import LaunchSizes, block_size, flat_grid, launch, tuned_blocks
from fla_kernels.ops.common.tiles import (flat_program, gather_rows, head_program, load_chunk_rows,
                                          load_rows, load_rows_t, load_state, store_rows)
from fla_kernels.precision import store_dtype

BT = 64  # tokens per chunk
BC = 16  # tokens per sub-chunk of the intra-chunk products
# Launch settings measured on the H100 (B=8, T=2048, H=16, K=V=128, bf16; benchmarks/tuning.md):
# two warps for both intra-chunk kernels, over 32-wide K-blocks for the scores and 64-wide ones
# for the backward; 64 x 32 blocks for the inter-chunk backward; two pipeline stages for the others.
INTRA_A = dict(BK_CAP=32, num_warps=2)
INTRA_BWD = dict(BK_CAP=64, num_warps=2)
INTER_BWD = dict(BK=64, BV=32, num_warps=4, num_stages=2)
TWO_STAGES = dict(num_warps=4, num_stages=2)
# the state kernel: 64 x 128 blocks of the state, two stages (0.179 -> 0.157 ms forward, 16-bit states)
FWD_H = dict(BK=64, BV=128, num_warps=4, num_stages=2)
LEVELS = BC.bit_length() - 1  # the levels of `diag_level_sums` in a block of BC rows


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

@triton.jit(do_not_specialize=["T"])
def _intra_A_kernel(q, k, g, A, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                    BC: tl.constexpr, BK: tl.constexpr, READS_PREVIOUS: tl.constexpr,
                    FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr, LEVELS: tl.constexpr):
    """A [B, H, T, BT]: the intra-chunk scores, on and below the diagonal.

    One program per (block, chunk, b*h) fills one [BC, BC] block of the chunk's scores: the
    NC diagonal blocks first, then the NC (NC - 1) / 2 blocks (I, J) left of them. Those are
    one dot over K of q_I * exp(pre_I) and k_J * exp(to_J), pre_I the gates of I up to each
    row, to_J those after each row of J up to the start of I (`span_sums` over the rows J..I),
    the reference point at the start of I, both exponents <= 0. A diagonal block: one dot per
    level of `diag_level_sums` with tf32 operands (IEEE for fp32 inputs), plus the gate-free
    i = j term sum_d q_id k_id in fp32 (gla). rwkv6's i = j term, the bonus sum_d q_id u_d k_id,
    is left out (zero): stored in a 16-bit A it would be rounded once more before o = A v, so its
    readers recompute it in fp32 (`_bonus`).
    """
    NC: tl.constexpr = BT // BC
    GATE_DTYPE: tl.constexpr = g.dtype.element_ty
    i_p, i_c, i_bh, i_b, i_h, row = head_program(T, H, NC + NC * (NC - 1) // 2, tl.cdiv(T, BT))
    base = row * K
    c0 = i_c * BT
    o_i = tl.arange(0, BC)
    if i_p >= NC:
        # block (I, J), J < I, numbered row by row: (1, 0), (2, 0), (2, 1), (3, 0), ...
        i_o = i_p - NC
        i_i = 1
        for i_r in tl.static_range(2, NC):
            i_i += (i_o >= i_r * (i_r - 1) // 2).to(tl.int32)
        i_j = i_o - i_i * (i_i - 1) // 2
        t_i = c0 + i_i * BC
        t_j = c0 + i_j * BC
        b_A = tl.zeros([BC, BC], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            b_q = load_rows(q, base, t_i, T, H, K, BC, BK, i_k)
            b_k = load_rows(k, base, t_j, T, H, K, BC, BK, i_k)
            b_g = load_chunk_rows(g, base, c0, i_j * BC, (i_i + 1) * BC, T, H, K, BT, BK, i_k)
            b_pre = gates_from(b_g, i_i * BC, i_i * BC, BT, BC, READS_PREVIOUS, FP32_DOT,
                               GATE_DTYPE)
            b_to = gates_after(b_g, i_j * BC, i_i * BC, BT, BC, FP32_DOT, GATE_DTYPE)
            b_A += mma(b_q * exp_nonpos(b_pre), tl.trans(b_k * exp_nonpos(b_to)), FP32_DOT,
                       OPERAND_DTYPE)
        p_A, m_A = _score_block(A, i_bh, T, t_i, i_j * BC, BC, BC, BT, False)
        tl.store(p_A, b_A.to(A.dtype.element_ty), mask=m_A)
    else:
        t_i = c0 + i_p * BC
        b_Ad = tl.zeros([BC, BC], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            b_q = load_rows(q, base, t_i, T, H, K, BC, BK, i_k)
            b_k = load_rows(k, base, t_i, T, H, K, BC, BK, i_k)
            if not READS_PREVIOUS:
                b_diag = tl.sum(b_q * b_k, axis=1)
                b_Ad += tl.where(o_i[:, None] == o_i[None, :], b_diag[:, None], 0.0)
            b_g = load_rows(g, base, t_i, T, H, K, BC, BK, i_k)
            for lvl in tl.static_range(LEVELS):
                f_row, f_col, pairs = diag_level_sums(b_g, 0, BC, BC, 1 << lvl, READS_PREVIOUS,
                                                      FP32_DOT, GATE_DTYPE)
                b_Ad += tl.where(pairs, mma(b_q * f_row, tl.trans(b_k * f_col), FP32_DOT,
                                            tl.float32), 0.0)
        p_A, m_A = _score_block(A, i_bh, T, t_i, i_p * BC, BC, BC, BT, False)
        tl.store(p_A, b_Ad.to(A.dtype.element_ty), mask=m_A)


@triton.jit
def _bonus(b_q, b_k, u, i_h, K: tl.constexpr, BK: tl.constexpr, i_k):
    """[BT] float32: rwkv6's bonus sum_d q_td u_d k_td over the K-block i_k of loaded rows."""
    o_d = i_k * BK + tl.arange(0, BK)
    b_u = tl.load(u + i_h * K + o_d, mask=o_d < K, other=0).to(tl.float32)
    return tl.sum(b_q * b_u[None, :] * b_k, axis=1)


@triton.jit(do_not_specialize=["T", "NT"])
def _fwd_o_kernel(q, k, v, g, u, states, A, o, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                  V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr, READS_PREVIOUS: tl.constexpr, FP32_DOT: tl.constexpr,
                  OPERAND_DTYPE: tl.constexpr):
    """o = scale * ((q * exp(pre)) h_c + A v (+ bonus * v, rwkv6, in fp32)), one program per
    (V-block, chunk, b*h)."""
    i_v, i_c, i_bh, i_b, i_h, row = head_program(T, H, tl.cdiv(V, BV), NT)
    base_k, base_v = row * K, row * V
    c0 = i_c * BT
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_bonus = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_q = load_rows(q, base_k, c0, T, H, K, BT, BK, i_k)
        b_pre, _, _ = chunk_gate_sums(g, base_k, c0, T, H, K, BT, BK, i_k, READS_PREVIOUS, FP32_DOT)
        b_h = load_state(states, i_bh * NT + i_c, K, V, BK, BV, i_k, i_v, False)
        b_o += mma(b_q * exp_nonpos(b_pre), b_h, FP32_DOT, OPERAND_DTYPE)
        if READS_PREVIOUS:
            b_bonus += _bonus(b_q, load_rows(k, base_k, c0, T, H, K, BT, BK, i_k), u, i_h, K, BK, i_k)
    p_A, m_A = _score_block(A, i_bh, T, c0, 0, BT, BT, BT, False)
    b_A = tl.load(p_A, mask=m_A, other=0)
    b_v = load_rows(v, base_v, c0, T, H, V, BT, BV, i_v)
    b_o += mma(b_A, b_v, FP32_DOT, OPERAND_DTYPE)
    if READS_PREVIOUS:
        b_o += b_bonus[:, None] * b_v
    store_rows(o, b_o * scale, base_v, c0, T, H, V, BT, BV, i_v)


# ----------------------------------------------------------------------------- backward kernels

@triton.jit(do_not_specialize=["T"])
def _bwd_dA_kernel(do, v, dA, scale, T, H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                   BV: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """dA [B, H, T, BT] float32 = scale * do v^T on and below the diagonal, per (chunk, b*h)."""
    i_c, _, i_bh = flat_program(tl.cdiv(T, BT), 1)
    i_b, i_h = i_bh // H, i_bh % H
    base_v = (i_b * T * H + i_h) * V
    c0 = i_c * BT
    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_do = load_rows(do, base_v, c0, T, H, V, BT, BV, i_v)
        b_vt = load_rows_t(v, base_v, c0, T, H, V, BT, BV, i_v)
        b_dA += mma(b_do, b_vt, FP32_DOT, OPERAND_DTYPE)
    p_dA, m_dA = _score_block(dA, i_bh, T, c0, 0, BT, BT, BT, False)
    tl.store(p_dA, b_dA * scale, mask=m_dA)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_dv_kernel(q, k, g, u, A, do, dh, dv, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                   V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                   BV: tl.constexpr, READS_PREVIOUS: tl.constexpr, FP32_DOT: tl.constexpr,
                   OPERAND_DTYPE: tl.constexpr):
    """dv = scale * A^T do + (k * exp(suf)) dh_c (+ scale * bonus * do, rwkv6, in fp32), per
    (V-block, chunk, b*h).

    dh_c is the gradient w.r.t. the state leaving chunk c.
    """
    i_v, i_c, i_bh, i_b, i_h, row = head_program(T, H, tl.cdiv(V, BV), NT)
    base_k, base_v = row * K, row * V
    c0 = i_c * BT
    p_At, m_At = _score_block(A, i_bh, T, c0, 0, BT, BT, BT, True)
    b_At = tl.load(p_At, mask=m_At, other=0)
    b_do = load_rows(do, base_v, c0, T, H, V, BT, BV, i_v)
    b_dv = mma(b_At, b_do * scale, FP32_DOT, OPERAND_DTYPE)
    b_bonus = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_k = load_rows(k, base_k, c0, T, H, K, BT, BK, i_k)
        _, b_suf, _ = chunk_gate_sums(g, base_k, c0, T, H, K, BT, BK, i_k, True, FP32_DOT)
        b_dh = load_state(dh, i_bh * NT + i_c, K, V, BK, BV, i_k, i_v, False)
        b_dv += mma(b_k * exp_nonpos(b_suf), b_dh, FP32_DOT, OPERAND_DTYPE)
        if READS_PREVIOUS:
            b_bonus += _bonus(load_rows(q, base_k, c0, T, H, K, BT, BK, i_k), b_k, u, i_h, K, BK, i_k)
    if READS_PREVIOUS:
        b_dv += b_bonus[:, None] * (b_do * scale)
    store_rows(dv, b_dv, base_v, c0, T, H, V, BT, BV, i_v)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_inter_kernel(k, v, g, do, states, dh, dqs, dks, dq_first, dk_last, boundary, scale,
                      T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, READS_PREVIOUS: tl.constexpr,
                      FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """Parts of dq, dk through the chunk's entering / leaving states, per (K-block, chunk, b*h).

    dqs = scale * exp(pre) * (do h_c^T) and dks = exp(suf) * (v dh_c^T), float32
    [B, T, H, K] (the intra kernel adds its parts in place), except for the rows
    whose path carries no gate: the last row L enters the leaving state as
    k_L^T v_L with suf_L = 0 (its dks goes to dk_last [B, H, NT, K]) and, for
    rwkv6, the chunk's first row reads h_c with pre = 0 (its dqs goes to
    dq_first). boundary[b, h, c] = sum_v (h_{c+1} - k_L^T v_L) * dh_c, the
    boundary term of dg without that gate-free path (`_bwd_intra_kernel` says
    why both sides drop it).
    """
    i_k, i_c, i_bh, i_b, i_h, row = head_program(T, H, tl.cdiv(K, BK), NT)
    base_k, base_v = row * K, row * V
    c0 = i_c * BT
    is_last = (c0 + tl.arange(0, BT) == tl.minimum(c0 + BT, T) - 1)[:, None]
    b_pre, b_suf, b_tot = chunk_gate_sums(g, base_k, c0, T, H, K, BT, BK, i_k, READS_PREVIOUS,
                                          FP32_DOT)
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_carried = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        _, _, b_dq_v, b_dk_v, b_carried_v = through_states(do, v, states, dh, base_v, i_bh * NT + i_c,
                                                           c0, T, H, K, V, BT, BK, BV, i_k, i_v,
                                                           FP32_DOT, OPERAND_DTYPE, True)
        b_dq += b_dq_v
        b_dk += b_dk_v
        b_carried += b_carried_v
    b_dk *= exp_nonpos(b_suf)
    # sum_v (h_{c+1} - k_L^T v_L) dh_c: the carried state's part, then the chunk's rows from the
    # very products k_j dk_j that chunk_gate_grad subtracts, so the two cancel to the last bit
    b_k = load_rows(k, base_k, c0, T, H, K, BT, BK, i_k).to(tl.float32)
    b_bound = (b_carried * exp_nonpos(b_tot)
               + tl.sum(tl.where(is_last, 0.0, b_k * b_dk), axis=0))
    o_d = i_k * BK + tl.arange(0, BK)
    tl.store(dk_last + (i_bh * NT + i_c) * K + o_d, tl.sum(tl.where(is_last, b_dk, 0.0), axis=0),
             mask=o_d < K)
    b_dq *= scale * exp_nonpos(b_pre)
    if READS_PREVIOUS:
        is_first = (tl.arange(0, BT) == 0)[:, None]
        tl.store(dq_first + (i_bh * NT + i_c) * K + o_d,
                 tl.sum(tl.where(is_first, b_dq, 0.0), axis=0), mask=o_d < K)
        b_dq = tl.where(is_first, 0.0, b_dq)
    store_rows(dqs, b_dq, base_k, c0, T, H, K, BT, BK, i_k)
    store_rows(dks, tl.where(is_last, 0.0, b_dk), base_k, c0, T, H, K, BT, BK, i_k)
    tl.store(boundary + (i_bh * NT + i_c) * K + o_d, b_bound, mask=o_d < K)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_intra_kernel(q, k, g, u, dA, dqs, dks, dq_first, dk_last, dq, dk, du_part, T, NT,
                      H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                      BK: tl.constexpr, READS_PREVIOUS: tl.constexpr, FP32_DOT: tl.constexpr,
                      OPERAND_DTYPE: tl.constexpr, LEVELS: tl.constexpr):
    """Intra-chunk parts of dq, dk, the gate-free terms and (rwkv6) du of the rows of one
    sub-chunk I, per (K-block and sub-chunk, chunk, b*h).

    dq_i += sum_{j < i} dA_ij k_j exp(pre_i - pre+_j) and
    dk_j += sum_{i > j} dA_ij q_i exp(pre_i - pre+_j): the pairs with each other
    sub-chunk as one dot (exp(pre_I) factored out of the dq sums, exp(suf_I)
    out of the dk sums; the exponents `span_sums` of the chunk's gates), the diagonal block as
    two dots per level of `diag_level_sums`. The dots take `mma_split` operands: see its
    docstring.

    dg comes from chunk_gate_grad, whose sums over the chunk cancel every term
    that carries no gate: a pair (i, j) with an empty gate product adds
    dA_ij q_i k_j through q_i dq_i and takes it away through k_j dk_j for every
    t <= j. Under strong decay those terms dominate dq and dk while dg is small
    (at g = -60 dg is about 1e-25), so summing them in float32 would cost dg its
    precision. dqs, dks (float32, read by chunk_gate_grad) therefore hold the
    gradients through the states without the gate-free terms: the diagonal
    pairs i = j (gla: q_i k_i; rwkv6: the u bonus), for rwkv6 the neighbour
    pairs j = i - 1 and the first row's read of h_c (dq_first), and the last
    row's own path into the leaving state (dk_last, also taken out of the
    boundary term). dq and dk, in the inputs' dtype, add them back.
    du_part[b, c * BT / BC + I, h] = sum_{i in I} dA_ii q_i k_i (rwkv6).
    """
    NC: tl.constexpr = BT // BC
    GATE_DTYPE: tl.constexpr = g.dtype.element_ty
    i_ki, i_c, i_bh, i_b, i_h, row = head_program(T, H, tl.cdiv(K, BK) * NC, NT)
    i_k, i_i = i_ki // NC, i_ki % NC
    base = row * K
    c0 = i_c * BT
    last = tl.minimum(c0 + BT, T) - 1
    o_i = tl.arange(0, BC)
    o_d = i_k * BK + tl.arange(0, BK)
    m_d = o_d < K
    b_dk_last = tl.load(dk_last + (i_bh * NT + i_c) * K + o_d, mask=m_d, other=0)
    if READS_PREVIOUS:
        b_u = tl.load(u + i_h * K + o_d, mask=m_d, other=0).to(tl.float32)
        b_dq_first = tl.load(dq_first + (i_bh * NT + i_c) * K + o_d, mask=m_d, other=0)
        SKIP: tl.constexpr = 1  # rwkv6's neighbour pairs j = i - 1 carry no gate
    else:
        SKIP: tl.constexpr = 0
    t_i = c0 + i_i * BC
    t = t_i + o_i
    b_q = load_rows(q, base, t_i, T, H, K, BC, BK, i_k)
    b_k = load_rows(k, base, t_i, T, H, K, BC, BK, i_k)
    # the gate sums, spans of the chunk's gates: I's own up to each row (pre) and after it (suf)
    b_g = load_rows(g, base, c0, T, H, K, BT, BK, i_k)
    b_pre = gates_from(b_g, i_i * BC, i_i * BC, BT, BC, READS_PREVIOUS, FP32_DOT, GATE_DTYPE)
    b_suf = gates_after(b_g, i_i * BC, (i_i + 1) * BC, BT, BC, FP32_DOT, GATE_DTYPE)
    p_dA = dA + (i_bh * T + t.to(tl.int64)) * BT
    b_dA_diag = tl.load(p_dA + (t - c0), mask=t < T, other=0)
    # rows I through the state from the sub-chunks J before I (dq) and after I (dk): one dot per
    # J, dA masked to the pairs that carry a gate
    b_dq = tl.zeros([BC, BK], dtype=tl.float32)
    for i_j in range(0, i_i):
        t_j = c0 + i_j * BC
        b_to = gates_after(b_g, i_j * BC, i_i * BC, BT, BC, FP32_DOT, GATE_DTYPE)
        p_blk, m_blk = _score_block(dA, i_bh, T, t_i, i_j * BC, BC, BC, BT, False)
        m_blk &= i_j * BC + o_i[None, :] + SKIP < (t - c0)[:, None]
        b_dAj = tl.load(p_blk, mask=m_blk, other=0)
        b_kj = load_rows(k, base, t_j, T, H, K, BC, BK, i_k)
        b_dq += mma_split(b_dAj, b_kj * exp_nonpos(b_to), FP32_DOT)
    b_dq *= exp_nonpos(b_pre)
    b_dk = tl.zeros([BC, BK], dtype=tl.float32)
    for i_j in range(i_i + 1, NC):
        t_j = c0 + i_j * BC
        b_from = gates_from(b_g, (i_i + 1) * BC, i_j * BC, BT, BC, READS_PREVIOUS, FP32_DOT,
                            GATE_DTYPE)
        p_blk, m_blk = _score_block(dA, i_bh, T, t_j, i_i * BC, BC, BC, BT, True)
        m_blk &= i_j * BC + o_i[None, :] > i_i * BC + o_i[:, None] + SKIP
        b_dAt = tl.load(p_blk, mask=m_blk, other=0)
        b_qj = load_rows(q, base, t_j, T, H, K, BC, BK, i_k)
        b_dk += mma_split(b_dAt, b_qj * exp_nonpos(b_from), FP32_DOT)
    b_dk *= exp_nonpos(b_suf)

    # the diagonal block, level by level (`diag_level_sums`): dq_i += sum_j dA_ij k_j E_ij and
    # dk_j += sum_i dA_ij q_i E_ij with E_ij = f_row_i * f_col_j
    p_blk, m_blk = _score_block(dA, i_bh, T, t_i, i_i * BC, BC, BC, BT, False)
    b_dAd = tl.load(p_blk, mask=m_blk & (o_i[:, None] > o_i[None, :] + SKIP), other=0)
    for lvl in tl.static_range(LEVELS):
        f_row, f_col, pairs = diag_level_sums(b_g, i_i * BC, BT, BC, 1 << lvl, READS_PREVIOUS,
                                              FP32_DOT, GATE_DTYPE)
        b_dAl = tl.where(pairs, b_dAd, 0.0)
        b_dq += f_row * mma_split(b_dAl, b_k * f_col, FP32_DOT)
        b_dk += f_col * mma_split(tl.trans(b_dAl), b_q * f_row, FP32_DOT)

    b_dqs = load_rows(dqs, base, t_i, T, H, K, BC, BK, i_k) + b_dq
    b_dks = load_rows(dks, base, t_i, T, H, K, BC, BK, i_k) + b_dk
    store_rows(dqs, b_dqs, base, t_i, T, H, K, BC, BK, i_k)
    store_rows(dks, b_dks, base, t_i, T, H, K, BC, BK, i_k)

    # the gate-free terms
    b_dk_free = tl.where((t == last)[:, None], b_dk_last[None, :], 0.0)
    if READS_PREVIOUS:
        # neighbour pairs, the first row's read of h_c, the u bonus
        m_prev = (t > c0) & (t < T)
        b_dA_prev = tl.load(p_dA + (t - 1 - c0), mask=m_prev, other=0)
        b_dq_free = b_dA_prev[:, None] * gather_rows(k, base, t - 1, m_prev, H, K, BK, i_k)
        b_dq_free += tl.where((t == c0)[:, None], b_dq_first[None, :], 0.0)
        m_next = t < last
        b_dA_next = tl.load(p_dA + BT + (t - c0), mask=m_next, other=0)
        b_dk_free += b_dA_next[:, None] * gather_rows(q, base, t + 1, m_next, H, K, BK, i_k)
        b_diag = b_dA_diag[:, None] * b_u[None, :]
        b_dq_free += b_diag * b_k
        b_dk_free += b_diag * b_q
        b_du = tl.sum(b_dA_diag[:, None] * b_q * b_k, axis=0)
    else:
        # the diagonal pairs
        b_dq_free = b_dA_diag[:, None] * b_k
        b_dk_free += b_dA_diag[:, None] * b_q
    store_rows(dq, b_dqs + b_dq_free, base, t_i, T, H, K, BC, BK, i_k)
    store_rows(dk, b_dks + b_dk_free, base, t_i, T, H, K, BC, BK, i_k)
    if READS_PREVIOUS:
        tl.store(du_part + (((i_b * NT + i_c) * NC + i_i) * H + i_h) * K + o_d, b_du, mask=m_d)


# ----------------------------------------------------------------------------- launchers

class _Launch(LaunchSizes):
    """`LaunchSizes` over chunks of BT, with the intra-chunk kernels' K-blocks and the op."""

    def __init__(self, q, v, reads_previous):
        super().__init__(q, v, BT)
        # triton 3.6 on the H100 miscompiles `_fwd_o_kernel` and `_bwd_dv_kernel` where a block
        # narrower than 64 is masked (compute-sanitizer: invalid shared-memory reads in their
        # products at V = 24 (32-wide V-blocks) and at K = 8 (32-wide K-blocks of dv); o and dv
        # wrong, or an illegal address); 64-wide masked blocks are clean at K, V in 8, 24, 48,
        # 64, 100. Those two kernels take 64-wide blocks of V, and dv 64-wide blocks of K.
        self.BK_DV = 64
        self.BV_O = 64
        self.NV_O = triton.cdiv(self.V, self.BV_O)
        self.BK_A = block_size(self.K, cap=INTRA_A["BK_CAP"])
        self.BK_BWD = block_size(self.K, cap=INTRA_BWD["BK_CAP"])
        self.reads_previous = bool(reads_previous)


def _intra_scores(L, q, k, g):
    """A [B, H, T, BT] (only its lower triangle is meaningful), in the inputs' dtype on a GPU:
    its two readers (`_fwd_o_kernel`, `_bwd_dv_kernel`) round it to their 16-bit operands
    anyway, so o and dv are the same to the bit with half the traffic (`store_dtype`)."""
    A = torch.empty(L.B, L.H, L.T, BT, dtype=store_dtype(q.dtype), device=q.device)
    NC = BT // BC
    launch(_intra_A_kernel, flat_grid(NC + NC * (NC - 1) // 2, L.NT, L.B * L.H),
        q, k, g, A, L.T, L.H, L.K, BT=BT, BC=BC, BK=L.BK_A,
        READS_PREVIOUS=L.reads_previous, num_warps=INTRA_A["num_warps"], LEVELS=LEVELS, **L.dots)
    return A


def _states(L, k, v, g, initial_state, state_dtype=torch.float32, chunk_offsets=None):
    """(states [B, H, NT, K, V] in state_dtype, entering each chunk; final state float32)."""
    return chunk_fwd_h(k, v, g, initial_state, BT, **L.state_dots, state_dtype=state_dtype,
                       tuning=FWD_H, chunk_offsets=chunk_offsets)


def chunk_gated_fwd(q, k, v, g, u, scale, initial_state, reads_previous, chunk_offsets=None):
    """(o in v's dtype, final state [B, H, K, V] float32, A).

    The states entering the chunks are stored in the inputs' dtype on a GPU: `_fwd_o_kernel`
    rounds them to its bf16 / fp16 operands anyway, so o is the same to the bit with half the
    traffic (under the interpreter, whose 16-bit stores truncate, in float32: `store_dtype`).

    A [B, H, T, BT], the intra-chunk scores (16-bit like the states, `_intra_scores`), is for
    `chunk_gated_bwd`: keeping it costs half the memory of one bf16 input at K = 128 and saves the
    backward its slowest recomputation.

    reads_previous=False: gla (u must be None); True: rwkv6 (u [H, K]). Inputs contiguous.
    chunk_offsets: None, or those of a packed batch's sequences on its aligned row (B = 1;
    ops/common/varlen.py): the states are walked per sequence, initial and final state
    [N, H, K, V]; every other kernel is chunk-local and runs on the row as it is.
    """
    assert (u is not None) == bool(reads_previous)
    L = _Launch(q, v, reads_previous)
    states, final = _states(L, k, v, g, initial_state, state_dtype=store_dtype(q.dtype),
                            chunk_offsets=chunk_offsets)
    A = _intra_scores(L, q, k, g)
    o = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=v.device)
    launch(_fwd_o_kernel, flat_grid(L.NV_O, L.NT, L.B * L.H),
        q, k, v, g, q if u is None else u, states, A, o, scale, L.T, L.NT, L.H, L.K, L.V, BT=BT, BK=L.BK,
        BV=L.BV_O, READS_PREVIOUS=L.reads_previous, **TWO_STAGES, **L.dots)
    return o.to(v.dtype), final, A


def chunk_gated_bwd(q, k, v, g, u, scale, initial_state, do, dht, reads_previous, A=None,
                    chunk_offsets=None):
    """(dq, dk, dv, dg, du or None, dh0 or None); dht may be None (no gradient from the final state).

    A: the forward's scores, recomputed when None. chunk_offsets: as for `chunk_gated_fwd`.
    """
    assert (u is not None) == bool(reads_previous)
    L = _Launch(q, v, reads_previous)
    grid_v = flat_grid(L.NV_O, L.NT, L.B * L.H)
    states, _ = _states(L, k, v, g, initial_state, chunk_offsets=chunk_offsets)
    dh, dh0 = chunk_bwd_dh(q, g, do, dht, scale, BT, q_gate_exclusive=L.reads_previous,
                           need_dh0=initial_state is not None, **L.state_dots,
                           chunk_offsets=chunk_offsets)
    if A is None:
        A = _intra_scores(L, q, k, g)
    dA = torch.empty(A.shape, dtype=torch.float32, device=A.device)
    launch(_bwd_dA_kernel, flat_grid(L.NT, L.B * L.H), do, v, dA, scale, L.T, L.H, L.V, BT=BT,
           BV=L.BV, **L.dots)
    dv = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=v.device)
    launch(_bwd_dv_kernel, grid_v, q, k, g, q if u is None else u, A, do, dh, dv, scale, L.T, L.NT,
           L.H, L.K, L.V, BT=BT, BK=L.BK_DV, BV=L.BV_O, READS_PREVIOUS=L.reads_previous,
           **TWO_STAGES, **L.dots)
    dqs = torch.empty(L.B, L.T, L.H, L.K, dtype=torch.float32, device=q.device)
    dks = torch.empty_like(dqs)
    boundary = torch.empty(L.B, L.H, L.NT, L.K, dtype=torch.float32, device=q.device)
    dk_last = torch.empty_like(boundary)
    dq_first = torch.empty_like(boundary) if L.reads_previous else dk_last
    BK, BV, options = tuned_blocks(L.K, L.V, INTER_BWD)
    launch(_bwd_inter_kernel, flat_grid(triton.cdiv(L.K, BK), L.NT, L.B * L.H),
        k, v, g, do, states, dh, dqs, dks, dq_first, dk_last, boundary, scale, L.T, L.NT, L.H,
        L.K, L.V, BT=BT, BK=BK, BV=BV, READS_PREVIOUS=L.reads_previous, **options, **L.dots)
    dq, dk = (torch.empty(x.shape, dtype=store_dtype(x.dtype), device=x.device) for x in (q, k))
    du_part = (torch.empty(L.B, L.NT * (BT // BC), L.H, L.K, dtype=torch.float32, device=q.device)
               if L.reads_previous else boundary)
    launch(_bwd_intra_kernel, flat_grid(triton.cdiv(L.K, L.BK_BWD) * (BT // BC), L.NT, L.B * L.H),
        q, k, g, q if u is None else u, dA, dqs, dks, dq_first, dk_last, dq, dk, du_part, L.T,
        L.NT, L.H, L.K, BT=BT, BC=BC, BK=L.BK_BWD, READS_PREVIOUS=L.reads_previous,
        num_warps=INTRA_BWD["num_warps"], LEVELS=LEVELS, **L.dots)
    dg = chunk_gate_grad(q, dqs, k, dks, boundary, BT, q_reads_current=not L.reads_previous,
                         out_dtype=store_dtype(g.dtype))
    du = du_part.sum(dim=(0, 1)).to(u.dtype) if L.reads_previous else None
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype), du, dh0
