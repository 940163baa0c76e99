"""Gated slot attention, chunked: two gated linear recurrences with the softmax between them.

Per (batch, head), with M slots, hk [K, M], hv [M, V] and z_t = scale q_t hk_t:
    hk_t = hk_{t-1} diag(exp(g_t)) + k_t^T s_t,  hv_t = diag(exp(g_t)) hv_{t-1} + s_t^T v_t
    p_t = softmax(z_t),  o_t = p_t hv_t
Written with the slot dimension first, both states follow S_t = diag(exp(g_t)) S_{t-1} + s_t^T b_t
(b = k for hk^T [M, K], b = v for hv), so `chunk_fwd_h` / `chunk_bwd_dh` (ops/common/chunk_state.py)
carry them from chunk to chunk of BT = 64 rows with keys s. One program per sub-chunk I of BC = 16
rows of a chunk c (the values' gradients: one per chunk). With P_I the inclusive prefix sum of g
inside I, pre the total of the sub-chunks before I in the chunk, w_ij = exp(g_{j+1} + ... + g_i)
and hk^T_c, hv_c the states entering the chunk, for rows i of I:
    z_i = scale (exp(P_i + pre) * (hk^T_c q_i) + sum_{j <= i} (q_i . k_j) s_j w_ij)
    o_i = (p_i * exp(P_i + pre)) hv_c + sum_{j <= i} C_ij v_j,   C_ij = sum_m p_im s_jm w_ijm
The pairs with the earlier sub-chunks J are one product over the chunk's rows whose factors carry
exp(P_I) and exp(the gates after each row j up to the start of I); ds of J, with the later rows,
takes exp(the gates from the end of J through each row i) and exp(the gates after j to the end of
J). The pairs inside I are dots per level of `diag_level_sums`; the pair (i, i) has no gate.
Each recurrence's C [BT, BT] per chunk is stored by the kernel that computes it anyway (the
forward for hv, when a backward can follow; the dq kernel for hk^T), so the values' gradients
dy = (s * exp(the gates after each row to the chunk's end)) dS_leaving + C^T x are two products
over the whole chunk and one masked product for the gates. Every exponent is a sum of the gates
over a span of rows, taken inside the kernel that needs it as one masked product on the tensor
cores (`gates_from` / `gates_after`, see chunk_state.py), never a difference: nothing overflows,
strong decays keep their precision, and no gate sums are stored. Products take tf32 operands
rounded to nearest for 16-bit inputs (`mma`) and IEEE fp32 ones for fp32 inputs, except the
products of the pairs (u, j) with j < u of a chunk, which take split-bf16 operands (`mma_split`,
about 16 bits): each pair is a term of dg_t for the rows t between j and u, once through y'_u
(the readout's pairs) and once through s_j ds'_j (the slots'), and one tf32 rounding on either
side left a residue that every one of those rows' sums shared (16-bit dg summed over tokens:
up to 16 times its bound on the H100).

Forward:  chunk_fwd_h (hk^T, hv) -> _fwd_kernel (o, p and, for dg, z', and hv's C; p, z' and C
          are kept for the backward).
Backward: chunk_fwd_h, then chunk_bwd_dh for hv (queries p) -> _bwd_dz_kernel
          (dp, the softmax backward dz = p (dp - <p, dp>), the dg readout sums y') -> chunk_bwd_dh
          for hk^T (queries dz, values q) -> _bwd_dq_kernel (dq, hk^T's C) -> _bwd_values_kernel
          twice, for hk^T (dk) then hv (dv), each also leaving its scores x_i . y_j and the paths
          of s into the leaving state -> _bwd_slots_kernel (ds, ds' and boundary' from both) ->
          chunk_gate_grad.

A packed batch (cu_seqlens) runs on its chunk-aligned row (ops/common/varlen.py): the state walks
take its sequences' chunk offsets, every other kernel runs as it is.

dg follows fused_recurrent.py's module docstring: per chunk,
    dg_t = boundary' + sum_{t <= u <= L} y'_u - sum_{t <= u < L} s_u * ds'_u
with y'_u = dz_u * z'_u + p_u * dp'_u, where z', dp' are z and dp without the pair (u, u), ds'_u
is ds_u without the pairs (i = u) and, for the chunk's last row L, without its path into the
leaving state, and boundary' = sum (S_L - s_L^T b_L) * dS_leaving over both states, taken as
exp(total) <S_c, dS_leaving> + sum_{u < L} s_u * (u's path into the leaving state): every term
carries a gate, so dg keeps its precision under strong decay.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.chunk_state import (chunk_bwd_dh, chunk_fwd_h, diag_level_sums,
                                                exp_nonpos, gates_after, gates_from)
from fla_kernels.ops.common.dot import mma, mma_split
from fla_kernels.ops.common.gate_grad import chunk_gate_grad
from fla_kernels.ops.common.launch import LaunchSizes, compiles_ahead, flat_grid, launch
from fla_kernels.ops.common.tiles import (diagonal, flat_program, load_chunk_rows, load_rows,
                                          load_state, store_rows)
from fla_kernels.ops.gsa.fused_recurrent import apply_gsa, gsa_grads
from fla_kernels.precision import store_dtype

BT = 64  # tokens per chunk: the states are stored at chunk starts
BC = 16  # tokens per sub-chunk (one gate block), one program each
NC = BT // BC
# per kernel: warps, pipeline stages and the widest column block of K or V read per step
# (H100, B=8, T=2048, H=16, K=V=128, M=64, bf16; benchmarks/tuning.md); None: the whole
# dimension. Not 8 warps for "values": triton 3.6 then reads shared memory out of bounds in a
# tf32 product at K = 32, V = 16 (compute-sanitizer; an illegal memory access on the H100).
TUNING = {
    "fwd": dict(num_warps=4, num_stages=2, block=128),
    "dz": dict(num_warps=2, num_stages=2, block=32),
    "dq": dict(num_warps=4, num_stages=2, block=None),
    "values": dict(num_warps=2, num_stages=2, block=32),
    "slots": dict(num_warps=4, num_stages=2, block=32),
}
LEVELS = BC.bit_length() - 1  # the levels of `diag_level_sums` in a block of BC rows


@triton.jit
def _sub_chunk(T, NT, H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """Where this program (grid: flat_grid(sub-chunks, B * H)) works: (row, i_s, c0, t0, index),
    with row the offset of (b, h) in rows of a [B, T, H, D] tensor (row * D is its base), i_s the
    sub-chunk's number in its chunk, c0 / t0 the first rows of the chunk / sub-chunk and index the
    chunk's number among the stored states [B * H * NT]."""
    NC: tl.constexpr = BT // BC
    i_t, _, i_bh = flat_program(tl.cdiv(T, BC), 1)
    i_c = i_t // NC
    return (i_bh // H) * T * H + i_bh % H, i_t % NC, i_c * BT, i_t * BC, i_bh * NT + i_c


@triton.jit
def _entering_gate(g, base_m, c0, i_s, T, H: tl.constexpr, M: tl.constexpr, BT: tl.constexpr,
                   BC: tl.constexpr, BM: tl.constexpr, FP32_DOT: tl.constexpr):
    """(exp(P_I), exp(P_I + pre)) [BC, BM] for sub-chunk I = i_s of the chunk at c0: the gates of I
    up to each row, and the gates from the chunk's start through each row (`gates_from`)."""
    GATE_DTYPE: tl.constexpr = g.dtype.element_ty
    t_i = i_s * BC
    b_g = load_chunk_rows(g, base_m, c0, 0, t_i + BC, T, H, M, BT, BM, 0)
    b_own = gates_from(b_g, t_i, t_i, BT, BC, False, FP32_DOT, GATE_DTYPE)
    b_in = gates_from(b_g, 0, t_i, BT, BC, False, FP32_DOT, GATE_DTYPE)
    return exp_nonpos(b_own), exp_nonpos(b_in)


@triton.jit
def _earlier_keys(s, g, base_m, c0, i_s, T, H: tl.constexpr, M: tl.constexpr, BT: tl.constexpr,
                  BC: tl.constexpr, BM: tl.constexpr, FP32_DOT: tl.constexpr):
    """[BT, BM] s_j exp(the gate after row j up to the start of sub-chunk I = i_s) for the rows j
    of the chunk at c0 before I, 0 for the others: with exp(P_I) on the rows of I, the pair
    (i, j) decays by the product of the two. All 0 for the first sub-chunk, at no cost."""
    b_sE = tl.zeros([BT, BM], dtype=tl.float32)
    if i_s > 0:
        t_i = i_s * BC
        b_g = load_chunk_rows(g, base_m, c0, 0, t_i, T, H, M, BT, BM, 0)
        b_to = exp_nonpos(gates_after(b_g, 0, t_i, BT, BT, FP32_DOT, g.dtype.element_ty))
        b_sE = load_chunk_rows(s, base_m, c0, 0, t_i, T, H, M, BT, BM, 0) * b_to
    return b_sE


@triton.jit
def _diag_weights(w, b_s, b_g, BC: tl.constexpr, LEVELS: tl.constexpr, FP32_DOT: tl.constexpr,
                  OPERAND_DTYPE: tl.constexpr, GATE_DTYPE: tl.constexpr):
    """[BC, BC] C_ij = sum_m w_im s_jm w_ijm for the pairs j <= i of a sub-chunk with gates b_g
    (values of GATE_DTYPE)."""
    o_i = tl.arange(0, BC)
    b_C = tl.where(o_i[:, None] == o_i[None, :], tl.sum(w * b_s, axis=1)[:, None], 0.0)
    for lvl in tl.static_range(LEVELS):
        f_row, f_col, pairs = diag_level_sums(b_g, 0, BC, BC, 1 << lvl, False, FP32_DOT, GATE_DTYPE)
        b_C += tl.where(pairs, mma(w * f_row, tl.trans(b_s * f_col), FP32_DOT, OPERAND_DTYPE), 0.0)
    return b_C


@triton.jit
def _store_weights(weights, b_C, base_c, c0, i_s, lo, hi, T, H: tl.constexpr, BT: tl.constexpr,
                   BC: tl.constexpr, WIDTH: tl.constexpr):
    """Store the columns lo <= j < hi of b_C [BC, WIDTH], whose column 0 is the chunk's column lo,
    into the rows of sub-chunk i_s of weights [B, T, H, BT] (row i, column j: C_ij of the chunk at
    c0; float32). The columns after a row's sub-chunk are never written (`_load_weights`)."""
    t = c0 + i_s * BC + tl.arange(0, BC)
    j = lo + tl.arange(0, WIDTH)
    offs = base_c + t.to(tl.int64)[:, None] * (H * BT) + j[None, :]
    tl.store(weights + offs, b_C, mask=(t[:, None] < T) & (j[None, :] < hi))


@triton.jit
def _load_weights(weights, base_c, c0, T, H: tl.constexpr, BT: tl.constexpr):
    """[BT, BT] C_ij (j <= i, 0 elsewhere) of the chunk at c0 from weights [B, T, H, BT]."""
    o = tl.arange(0, BT)
    t = c0 + o
    offs = base_c + t.to(tl.int64)[:, None] * (H * BT) + o[None, :]
    return tl.load(weights + offs, mask=(t[:, None] < T) & (o[None, :] <= o[:, None]), other=0)


@triton.jit
def _readout(x, y, s, g, b_own, b_in, states, index, base, base_m, c0, i_s, T, H: tl.constexpr,
             D: tl.constexpr, M: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BD: tl.constexpr,
             BM: tl.constexpr, LEVELS: tl.constexpr, FP32_DOT: tl.constexpr,
             OPERAND_DTYPE: tl.constexpr):
    """(r', r_ii, sE) [BC, BM] for the rows i of sub-chunk I = i_s of the chunk at c0:
    r'_i = exp(P_i + pre) (S x_i^T) + sum_{j < i} (x_i . y_j) s_j w_ij, and the gate-free pair
    r_ii = (x_i . y_i) s_i, and sE = `_earlier_keys` of I (for `_mix`). (b_own, b_in): I's
    `_entering_gate`. x, y [B, T, H, D] and S = states[index] [M, D], entering the chunk, read in
    column blocks of BD; the pairs with earlier sub-chunks as one product over the chunk's rows."""
    t_i = c0 + i_s * BC
    b_r = tl.zeros([BC, BM], dtype=tl.float32)
    b_A = tl.zeros([BC, BC], dtype=tl.float32)
    b_Ac = tl.zeros([BC, BT], dtype=tl.float32)
    for i_d in range(tl.cdiv(D, BD)):
        b_x = load_rows(x, base, t_i, T, H, D, BC, BD, i_d)
        b_r += mma(b_x, tl.trans(load_state(states, index, M, D, BM, BD, 0, i_d, False)), FP32_DOT,
                   OPERAND_DTYPE)
        b_A += mma(b_x, tl.trans(load_rows(y, base, t_i, T, H, D, BC, BD, i_d)), FP32_DOT,
                   OPERAND_DTYPE)
        if i_s > 0:
            b_Ac += mma(b_x, tl.trans(load_rows(y, base, c0, T, H, D, BT, BD, i_d)), FP32_DOT,
                        OPERAND_DTYPE)
    b_r *= b_in
    b_sE = _earlier_keys(s, g, base_m, c0, i_s, T, H, M, BT, BC, BM, FP32_DOT)
    if i_s > 0:
        b_r += b_own * mma_split(b_Ac, b_sE, FP32_DOT)
    b_s = load_rows(s, base_m, t_i, T, H, M, BC, BM, 0)
    b_g = load_rows(g, base_m, t_i, T, H, M, BC, BM, 0)
    for lvl in tl.static_range(LEVELS):
        f_row, f_col, pairs = diag_level_sums(b_g, 0, BC, BC, 1 << lvl, False, FP32_DOT,
                                              g.dtype.element_ty)
        b_r += f_row * mma_split(tl.where(pairs, b_A, 0.0), b_s * f_col, FP32_DOT)
    return b_r, diagonal(b_A, BC)[:, None] * b_s, b_sE


@triton.jit
def _earlier_weights(w, b_own, b_sE, weights, base_c, c0, i_s, T, H: tl.constexpr,
                     BT: tl.constexpr, BC: tl.constexpr, FP32_DOT: tl.constexpr,
                     OPERAND_DTYPE: tl.constexpr):
    """[BC, BT] C_ij for the rows i of sub-chunk I = i_s and the rows j of the sub-chunks before
    it (0 in the other columns), from w [BC, BM] and I's `_entering_gate` b_own and
    `_earlier_keys` b_sE; left in weights too unless that is None (`_store_weights`)."""
    b_C = mma(w * b_own, tl.trans(b_sE), FP32_DOT, OPERAND_DTYPE)
    if weights is not None:
        _store_weights(weights, b_C, base_c, c0, i_s, 0, i_s * BC, T, H, BT, BC, BT)
    return b_C


@triton.jit
def _own_weights(w, s, g, weights, base_m, base_c, c0, i_s, T, H: tl.constexpr, M: tl.constexpr,
                 BT: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr, LEVELS: tl.constexpr,
                 FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """[BC, BC] C_ij for the pairs j <= i of sub-chunk I = i_s (`_diag_weights`); left in weights
    too unless that is None."""
    t_i = c0 + i_s * BC
    b_C = _diag_weights(w, load_rows(s, base_m, t_i, T, H, M, BC, BM, 0),
                        load_rows(g, base_m, t_i, T, H, M, BC, BM, 0), BC, LEVELS, FP32_DOT,
                        OPERAND_DTYPE, g.dtype.element_ty)
    if weights is not None:
        _store_weights(weights, b_C, base_c, c0, i_s, i_s * BC, (i_s + 1) * BC, T, H, BT, BC, BC)
    return b_C


@triton.jit
def _mix(w, y, s, g, b_own, b_in, b_sE, states, weights, index, base, base_m, base_c, c0, i_s, T,
         H: tl.constexpr, D: tl.constexpr, M: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
         BW: tl.constexpr, BM: tl.constexpr, LEVELS: tl.constexpr, FP32_DOT: tl.constexpr,
         OPERAND_DTYPE: tl.constexpr):
    """[BC, BW] (w_I * exp(P_I + pre)) S + sum_{j <= i} C_ij y_j, with C_ij = sum_m w_im s_jm w_ijm,
    for the rows of sub-chunk I = i_s of the chunk at c0. w [BC, BM]; (b_own, b_in): I's
    `_entering_gate`; b_sE: `_earlier_keys` of I or None (computed here); S = states[index]
    [M, D], entering the chunk, read whole (column blocks, which recompute C, measured slower);
    the pairs with earlier sub-chunks as one product over the chunk's rows. weights: None, or
    where to leave C for `_bwd_values_kernel` (at base_c, `_store_weights`)."""
    t_i = c0 + i_s * BC
    b_r = mma(w * b_in, load_state(states, index, M, D, BM, BW, 0, 0, False), FP32_DOT,
              OPERAND_DTYPE)
    if b_sE is None:
        b_sE = _earlier_keys(s, g, base_m, c0, i_s, T, H, M, BT, BC, BM, FP32_DOT)
    if i_s > 0:
        b_C = _earlier_weights(w, b_own, b_sE, weights, base_c, c0, i_s, T, H, BT, BC, FP32_DOT,
                               OPERAND_DTYPE)
        b_r += mma(b_C, load_rows(y, base, c0, T, H, D, BT, BW, 0), FP32_DOT, OPERAND_DTYPE)
    b_C = _own_weights(w, s, g, weights, base_m, base_c, c0, i_s, T, H, M, BT, BC, BM, LEVELS,
                       FP32_DOT, OPERAND_DTYPE)
    return b_r + mma(b_C, load_rows(y, base, t_i, T, H, D, BC, BW, 0), FP32_DOT, OPERAND_DTYPE)


@triton.jit(do_not_specialize=["T", "NT"])
def _fwd_kernel(q, k, v, s, g, states_k, states_v, p, zm, o, weights, scale, T, NT,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
                BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BVW: tl.constexpr,
                BM: tl.constexpr, LEVELS: tl.constexpr, STORE_ZM: tl.constexpr,
                FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """o [B, T, H, V], p [B, T, H, M] float32 and (STORE_ZM, for the gate gradient) z' = z without
    the pair (i, i) [B, T, H, M] float32, one program per (sub-chunk, b*h). BK: the column block
    of hk^T and of the scores q k^T; BVW: the whole (power-of-two) V. weights: None, or where to
    leave the hv recurrence's C (w = p) for the backward's `_bwd_values_kernel`."""
    row, i_s, c0, t_i, index = _sub_chunk(T, NT, H, BT, BC)
    base_k, base_v, base_m = row * K, row * V, row * M
    b_own, b_in = _entering_gate(g, base_m, c0, i_s, T, H, M, BT, BC, BM, FP32_DOT)
    b_z, b_zd, b_sE = _readout(q, k, s, g, b_own, b_in, states_k, index, base_k, base_m, c0, i_s, T,
                               H, K, M, BT, BC, BK, BM, LEVELS, FP32_DOT, OPERAND_DTYPE)
    if STORE_ZM:
        store_rows(zm, b_z * scale, base_m, t_i, T, H, M, BC, BM, 0)
    m_m = tl.arange(0, BM) < M
    b_z = tl.where(m_m[None, :], (b_z + b_zd) * scale, float("-inf"))
    b_e = tl.exp(b_z - tl.max(b_z, axis=1)[:, None])
    b_p = b_e / tl.sum(b_e, axis=1)[:, None]
    store_rows(p, b_p, base_m, t_i, T, H, M, BC, BM, 0)
    b_o = _mix(b_p, v, s, g, b_own, b_in, b_sE, states_v, weights, index, base_v, base_m, row * BT,
               c0, i_s, T, H, V, M, BT, BC, BVW, BM, LEVELS, FP32_DOT, OPERAND_DTYPE)
    store_rows(o, b_o, base_v, t_i, T, H, V, BC, BVW, 0)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_dz_kernel(v, s, g, p, zm, do, states_v, dz, y, T, NT, H: tl.constexpr,
                   V: tl.constexpr, M: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                   BV: tl.constexpr, BM: tl.constexpr, LEVELS: tl.constexpr,
                   NEED_DG: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """dz = p (dp - <p, dp>) with dp_i = hv_i do_i and, with NEED_DG, y' = dz z' + p dp' from the
    forward's z' ([B, T, H, M] float32), one program per (sub-chunk, b*h). BV: the column block
    of the state and the scores."""
    row, i_s, c0, t_i, index = _sub_chunk(T, NT, H, BT, BC)
    base_v, base_m = row * V, row * M
    b_own, b_in = _entering_gate(g, base_m, c0, i_s, T, H, M, BT, BC, BM, FP32_DOT)
    b_dpm, b_dpd, _ = _readout(do, v, s, g, b_own, b_in, states_v, index, base_v, base_m, c0, i_s,
                               T, H, V, M, BT, BC, BV, BM, LEVELS, FP32_DOT, OPERAND_DTYPE)
    b_p = load_rows(p, base_m, t_i, T, H, M, BC, BM, 0)
    b_dp = b_dpm + b_dpd
    b_dz = b_p * (b_dp - tl.sum(b_p * b_dp, axis=1)[:, None])
    store_rows(dz, b_dz, base_m, t_i, T, H, M, BC, BM, 0)
    if NEED_DG:
        b_zm = load_rows(zm, base_m, t_i, T, H, M, BC, BM, 0)
        store_rows(y, b_dz * b_zm + b_p * b_dpm, base_m, t_i, T, H, M, BC, BM, 0)


@triton.jit
def _state_inner(states, dh, index, M: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                 BD: tl.constexpr):
    """[BM] sum over the columns of states[index] * dh[index] ([M, D] matrices), in column
    blocks of BD."""
    b_sum = tl.zeros([BM], dtype=tl.float32)
    for i_d in range(tl.cdiv(D, BD)):
        b_sum += tl.sum(load_state(states, index, M, D, BM, BD, 0, i_d, False)
                        * load_state(dh, index, M, D, BM, BD, 0, i_d, False), axis=1)
    return b_sum


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_dq_kernel(k, s, g, dz, states_k, dq, weights, scale, T, NT, H: tl.constexpr,
                   K: tl.constexpr, M: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                   BKW: tl.constexpr, BM: tl.constexpr, LEVELS: tl.constexpr,
                   FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """dq_i = scale sum_m dz_im (d z_im / d q_i): through the state entering the chunk and the rows
    j <= i, one program per (sub-chunk, b*h). Leaves the hk recurrence's C (w = scale dz) in
    weights for `_bwd_values_kernel`."""
    row, i_s, c0, t0, index = _sub_chunk(T, NT, H, BT, BC)
    base_k, base_m = row * K, row * M
    b_dz = load_rows(dz, base_m, t0, T, H, M, BC, BM, 0) * scale
    b_own, b_in = _entering_gate(g, base_m, c0, i_s, T, H, M, BT, BC, BM, FP32_DOT)
    b_dq = _mix(b_dz, k, s, g, b_own, b_in, None, states_k, weights, index, base_k, base_m,
                row * BT, c0, i_s, T, H, K, M, BT, BC, BKW, BM, LEVELS, FP32_DOT, OPERAND_DTYPE)
    store_rows(dq, b_dq, base_k, t0, T, H, K, BC, BKW, 0)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_values_kernel(x, y, s, g, weights, dh, dy, scores, leave, T, NT, H: tl.constexpr,
                       D: tl.constexpr, M: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                       BM: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """The gradient dy of the rows y_j of a chunk as the values of one of the two recurrences, one
    program per (chunk, b*h): (x, y, weights, dh) = (q, k, C of hk^T, dhk) or (do, v, C of hv, dhv),
    dh [B, H, NT, M, D] the gradients w.r.t. the states leaving each chunk (slot dimension first),
    D read in column blocks of BD. With out_j = exp(the gates after row j to the chunk's end),
        dy_j = (s_j * out_j) dh + sum_{i >= j} C_ij x_i,
    and for `_bwd_slots_kernel` the chunk's scores x_i . y_j (all pairs) [B, T, H, BT] and the
    paths of s_j into the leaving state, leave_j = out_j * (y_j dh^T) [B, T, H, M], float32."""
    i_c, _, i_bh = flat_program(NT, 1)
    row = (i_bh // H) * T * H + i_bh % H
    c0, index = i_c * BT, i_bh * NT + i_c
    base, base_m, base_c = row * D, row * M, row * BT
    b_g = load_rows(g, base_m, c0, T, H, M, BT, BM, 0)
    b_out = exp_nonpos(gates_after(b_g, 0, BT, BT, BT, FP32_DOT, g.dtype.element_ty))
    b_sO = load_rows(s, base_m, c0, T, H, M, BT, BM, 0) * b_out
    b_C = _load_weights(weights, base_c, c0, T, H, BT)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    b_leave = tl.zeros([BT, BM], dtype=tl.float32)
    for i_d in range(tl.cdiv(D, BD)):
        b_dh = load_state(dh, index, M, D, BM, BD, 0, i_d, False)
        b_x = load_rows(x, base, c0, T, H, D, BT, BD, i_d)
        b_y = load_rows(y, base, c0, T, H, D, BT, BD, i_d)
        b_leave += mma(b_y, tl.trans(b_dh), FP32_DOT, OPERAND_DTYPE)
        b_A += mma(b_x, tl.trans(b_y), FP32_DOT, OPERAND_DTYPE)
        b_dy = mma(b_sO, b_dh, FP32_DOT, OPERAND_DTYPE) + mma(tl.trans(b_C), b_x, FP32_DOT,
                                                              OPERAND_DTYPE)
        store_rows(dy, b_dy, base, c0, T, H, D, BT, BD, i_d)
    store_rows(scores, b_A, base_c, c0, T, H, BT, BT, BT, 0)
    store_rows(leave, b_leave * b_out, base_m, c0, T, H, M, BT, BM, 0)


@triton.jit
def _slot_pairs(w, w_scale, scores, b_from, base_m, base_c, c0, i_s, t0, T, H: tl.constexpr,
                M: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr,
                FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """(w_J [BC, BM], A_JJ [BC, BC], later [BC, BM]) of one recurrence for sub-chunk J = i_s:
    its weights w * w_scale on J's rows, the scores A_ij = x_i . y_j inside J, and
    later_j = sum_{i after J} A_ij w_i exp(the gates from J's end through i), with b_from that
    exponential on the rows after J: with exp(the gates after j to J's end) on the rows of J, the
    pair (i, j) decays by the product of the two."""
    t_after = (i_s + 1) * BC
    b_wL = load_chunk_rows(w, base_m, c0, t_after, BT, T, H, M, BT, BM, 0) * (w_scale * b_from)
    b_AL = load_chunk_rows(scores + i_s * BC, base_c, c0, t_after, BT, T, H, BT, BT, BC, 0)
    return (load_rows(w, base_m, t0, T, H, M, BC, BM, 0) * w_scale,
            load_rows(scores + i_s * BC, base_c, t0, T, H, BT, BC, BC, 0),
            mma_split(tl.trans(b_AL), b_wL, FP32_DOT))


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_slots_kernel(dz, p, s, g, scores_k, leave_k, scores_v, leave_v, states_k, dhk, states_v,
                      dhv, ds, dsm, parts, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                      V: tl.constexpr, M: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr, LEVELS: tl.constexpr,
                      NEED_DG: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """ds for the rows j of sub-chunk J, one program per (sub-chunk, b*h), from both recurrences
    at once: with (w, A, leave) = (scale dz, the scores and paths of hk^T) and (p, those of hv),
    each from `_bwd_values_kernel`,
        ds_j = sum over both of (sum_{i >= j} A_ij w_i w_ij + leave_j),
    the later sub-chunks as one product over the chunk's rows, J's own block by levels; the gate
    factors are shared by the two. With NEED_DG also ds' [B, T, H, M] and J's part of boundary'
    [B, H, NT * NC, M] (both float32)."""
    NC: tl.constexpr = BT // BC
    GATE_DTYPE: tl.constexpr = g.dtype.element_ty
    row, i_s, c0, t0, index = _sub_chunk(T, NT, H, BT, BC)
    base_m, base_c = row * M, row * BT
    # the pairs (i, j) with i in a later sub-chunk: exp(the gates after j to J's end) times
    # exp(the gates from J's end through i), one product over the chunk's rows i
    b_gc = load_chunk_rows(g, base_m, c0, i_s * BC, BT, T, H, M, BT, BM, 0)
    b_eQ = exp_nonpos(gates_after(b_gc, i_s * BC, (i_s + 1) * BC, BT, BC, FP32_DOT, GATE_DTYPE))
    b_from = exp_nonpos(gates_from(b_gc, (i_s + 1) * BC, 0, BT, BT, False, FP32_DOT, GATE_DTYPE))
    b_wk, b_Ak, b_later = _slot_pairs(dz, scale, scores_k, b_from, base_m, base_c, c0, i_s, t0,
                                      T, H, M, BT, BC, BM, FP32_DOT, OPERAND_DTYPE)
    b_wv, b_Av, b_later_v = _slot_pairs(p, 1.0, scores_v, b_from, base_m, base_c, c0, i_s, t0,
                                        T, H, M, BT, BC, BM, FP32_DOT, OPERAND_DTYPE)
    b_ds_in = b_eQ * (b_later + b_later_v)
    # then the pairs j < i inside J, by levels
    b_g = load_rows(g, base_m, t0, T, H, M, BC, BM, 0)
    for lvl in tl.static_range(LEVELS):
        f_row, f_col, pairs = diag_level_sums(b_g, 0, BC, BC, 1 << lvl, False, FP32_DOT,
                                              GATE_DTYPE)
        b_ds_in += f_col * (
            mma_split(tl.trans(tl.where(pairs, b_Ak, 0.0)), b_wk * f_row, FP32_DOT)
            + mma_split(tl.trans(tl.where(pairs, b_Av, 0.0)), b_wv * f_row, FP32_DOT))
    b_leave = (load_rows(leave_k, base_m, t0, T, H, M, BC, BM, 0)
               + load_rows(leave_v, base_m, t0, T, H, M, BC, BM, 0))
    b_pair = diagonal(b_Ak, BC)[:, None] * b_wk + diagonal(b_Av, BC)[:, None] * b_wv
    store_rows(ds, b_ds_in + b_pair + b_leave, base_m, t0, T, H, M, BC, BM, 0)
    if NEED_DG:
        is_last = (t0 + tl.arange(0, BC) == tl.minimum(c0 + BT, T) - 1)[:, None]
        b_leave = tl.where(is_last, 0.0, b_leave)
        # ds' leaves out the pair (j, j) and the last row's path into the leaving state
        store_rows(dsm, b_ds_in + b_leave, base_m, t0, T, H, M, BC, BM, 0)
        # boundary' = exp(total) <S_c, dS_leaving> + sum_{u < L} s_u (u's path into S_leaving)
        b_bound = tl.sum(load_rows(s, base_m, t0, T, H, M, BC, BM, 0) * b_leave, axis=0)
        if i_s == 0:
            b_tot = tl.sum(load_rows(g, base_m, c0, T, H, M, BT, BM, 0), axis=0)
            b_bound += exp_nonpos(b_tot) * (_state_inner(states_k, dhk, index, M, K, BM, BK)
                                            + _state_inner(states_v, dhv, index, M, V, BM, BV))
        o_m = tl.arange(0, BM)
        tl.store(parts + (index * NC + i_s) * M + o_m, b_bound, mask=o_m < M)


def _pow2(n):
    return max(16, triton.next_power_of_2(n))


class _Launch(LaunchSizes):
    """`LaunchSizes` over chunks of BT with tf32 products, the M slots, the sub-chunks and the
    column blocks of each kernel."""

    def __init__(self, q, v, s):
        # 16-bit inputs take tf32 products with operands rounded to nearest (`mma`), fp32 inputs
        # IEEE ones. With bf16 tensor-core operands (the fp32 states and the softmax terms rounded
        # to bf16) dg reached 5.2 floors at T=1000, M=64, strong gates on the H100, over the
        # bound; tf32 keeps 3 more bits.
        super().__init__(q, v, BT, tf32=True)
        self.M = s.shape[-1]
        self.NS = triton.cdiv(self.T, BC)
        # K and V are read in column blocks (`TUNING`), the M slots whole (the softmax needs
        # every slot)
        self.BKW, self.BVW, self.BM = _pow2(self.K), _pow2(self.V), _pow2(self.M)

    @staticmethod
    def block(kernel, D):
        """The column block in which `kernel` reads a head dimension of size D."""
        block = TUNING[kernel]["block"]
        return _pow2(D) if block is None else min(block, _pow2(D))

    def kw(self, kernel, sub_chunks=True, **sizes):
        """The launch keywords every kernel takes (and those of the sub-chunks, BC and LEVELS,
        for a kernel with a program per sub-chunk), `kernel`'s warps and stages, and `sizes`."""
        launch = {name: TUNING[kernel][name] for name in ("num_warps", "num_stages")}
        if sub_chunks:
            sizes.update(BC=BC, LEVELS=LEVELS)
        return dict(H=self.H, M=self.M, BT=BT, BM=self.BM, **self.dots, **launch, **sizes)


def _states(L, q, k, v, s, g, hk0, hv0, chunk_offsets=None):
    """((hk^T states [B, H, NT, M, K], final hk^T), (hv states [B, H, NT, M, V], final hv)),
    float32. chunk_offsets: None, or those of a packed batch's sequences (`chunk_fwd_h`)."""
    hk0t = None if hk0 is None else hk0.to(torch.float32).transpose(-1, -2).contiguous()
    hv0 = None if hv0 is None else hv0.to(torch.float32).contiguous()
    states_k = chunk_fwd_h(s, k, g, hk0t, BT, **L.state_dots, chunk_offsets=chunk_offsets)
    states_v = chunk_fwd_h(s, v, g, hv0, BT, **L.state_dots, chunk_offsets=chunk_offsets)
    return states_k, states_v


def _forward(L, q, k, v, s, g, scale, hk0, hv0, store_zm, store_weights, chunk_offsets=None):
    """(o, p [B, T, H, M] float32, z' [B, T, H, M] float32 or None, the hv recurrence's C
    [B, T, H, BT] float32 or None, final hk^T, final hv)."""
    (states_k, final_k), (states_v, final_v) = _states(L, q, k, v, s, g, hk0, hv0, chunk_offsets)
    p = torch.empty(L.B, L.T, L.H, L.M, dtype=torch.float32, device=q.device)
    zm = torch.empty_like(p) if store_zm else None
    weights = torch.empty(L.B, L.T, L.H, BT, dtype=torch.float32, device=q.device) \
        if store_weights else None
    o = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=v.device)
    launch(_fwd_kernel, flat_grid(L.NS, L.B * L.H), q, k, v, s, g, states_k, states_v, p, zm, o,
           weights, scale, L.T, L.NT, STORE_ZM=store_zm,
           **L.kw("fwd", K=L.K, V=L.V, BK=L.block("fwd", L.K), BVW=L.BVW))
    return o, p, zm, weights, final_k, final_v


class ChunkGSAFunction(torch.autograd.Function):
    """Autograd wrapper: saves the inputs, p and (for dg) z'; backward recomputes the states.
    chunk_offsets: None, or those of a packed batch's sequences on its aligned row (B = 1,
    ops/common/varlen.py): initial and final states [N, ...]."""

    @staticmethod
    @compiles_ahead
    def forward(ctx, q, k, v, s, g, scale, hk0, hv0, output_final_state, chunk_offsets=None):
        q, k, v, s, g = (x.contiguous() for x in (q, k, v, s, g))
        L = _Launch(q, v, s)
        # what the backward needs, kept only when one can follow: z' for dg, hv's C for any
        o, p, zm, weights_v, final_k, final_v = _forward(
            L, q, k, v, s, g, scale, hk0, hv0, store_zm=ctx.needs_input_grad[4],
            store_weights=any(ctx.needs_input_grad), chunk_offsets=chunk_offsets)
        hkt = hvt = None
        if output_final_state:
            hkt = final_k.transpose(-1, -2).contiguous()
            hvt = final_v
        ctx.save_for_backward(q, k, v, s, g, p, zm, weights_v, hk0, hv0)
        ctx.chunk_offsets = chunk_offsets
        ctx.scale = scale
        ctx.set_materialize_grads(False)
        return o.to(v.dtype), hkt, hvt

    @staticmethod
    @compiles_ahead
    def backward(ctx, do, dhkt, dhvt):
        q, k, v, s, g, p, zm, weights_v, hk0, hv0 = ctx.saved_tensors
        need_g = ctx.needs_input_grad[4]
        scale = ctx.scale
        L = _Launch(q, v, s)
        f32 = dict(dtype=torch.float32, device=q.device)
        do = torch.zeros_like(v) if do is None else do.contiguous()
        use_h0 = hk0 is not None
        (states_k, _), (states_v, _) = _states(L, q, k, v, s, g, hk0, hv0, ctx.chunk_offsets)
        dhvt = None if dhvt is None else dhvt.to(torch.float32).contiguous()
        dhv, dhv0 = chunk_bwd_dh(p, g, do, dhvt, 1.0, BT, q_gate_exclusive=False,
                                 need_dh0=use_h0, **L.state_dots, chunk_offsets=ctx.chunk_offsets)
        dz = torch.empty(L.B, L.T, L.H, L.M, **f32)
        y = torch.empty_like(dz) if need_g else dz  # dz: a stand-in, never written
        grid = flat_grid(L.NS, L.B * L.H)
        launch(_bwd_dz_kernel, grid, v, s, g, p, zm, do, states_v, dz, y, L.T, L.NT, NEED_DG=need_g,
               **L.kw("dz", V=L.V, BV=L.block("dz", L.V)))

        dhkt_t = None if dhkt is None else dhkt.to(torch.float32).transpose(-1, -2).contiguous()
        dhk, dhk0 = chunk_bwd_dh(dz, g, q, dhkt_t, scale, BT, q_gate_exclusive=False,
                                 need_dh0=use_h0, **L.state_dots, chunk_offsets=ctx.chunk_offsets)
        dq, dk, dv, ds = (torch.empty(x.shape, dtype=store_dtype(x.dtype), device=x.device)
                          for x in (q, k, v, s))
        weights_k = torch.empty_like(weights_v)  # C of hk^T, left by the dq kernel
        launch(_bwd_dq_kernel, grid, k, s, g, dz, states_k, dq, weights_k, scale, L.T, L.NT,
               **L.kw("dq", K=L.K, BKW=L.block("dq", L.K)))
        dsm = torch.empty_like(dz) if need_g else dz  # dz: a stand-in, never written
        # one part of boundary' per sub-chunk, summed per chunk below (no atomics: deterministic)
        parts = torch.zeros(L.B, L.H, L.NT * NC, L.M, **f32) if need_g else None
        scores_k, scores_v = (torch.empty(L.B, L.T, L.H, BT, **f32) for _ in range(2))
        leave_k, leave_v = torch.empty_like(dz), torch.empty_like(dz)
        passes = ((q, k, weights_k, dhk, dk, scores_k, leave_k),
                  (do, v, weights_v, dhv, dv, scores_v, leave_v))
        for x, b, weights, dh, db, scores, leave in passes:
            D = x.shape[-1]
            launch(_bwd_values_kernel, flat_grid(L.NT, L.B * L.H), x, b, s, g, weights, dh, db,
                   scores, leave, L.T, L.NT,
                   **L.kw("values", sub_chunks=False, D=D, BD=L.block("values", D)))
        launch(_bwd_slots_kernel, grid, dz, p, s, g, scores_k, leave_k, scores_v, leave_v, states_k,
               dhk, states_v, dhv, ds, dsm, parts, scale, L.T, L.NT, NEED_DG=need_g,
               **L.kw("slots", K=L.K, V=L.V, BK=L.block("slots", L.K), BV=L.block("slots", L.V)))
        dg = None
        if need_g:
            bound = parts.view(L.B, L.H, L.NT, NC, L.M).sum(3)
            dg = chunk_gate_grad(y, torch.ones_like(y), s, dsm, bound, BT, q_reads_current=True,
                                 out_dtype=store_dtype(g.dtype)).to(g.dtype)
        if dhk0 is not None:
            dhk0 = dhk0.transpose(-1, -2).contiguous()
        h0_dtypes = (hk0.dtype, hv0.dtype) if use_h0 else None
        return gsa_grads(ctx, (q, k, v, s), (dq, dk, dv, ds), dg, (dhk0, dhv0), h0_dtypes)


def chunk_gsa(q, k, v, s, g=None, scale=None, initial_state=None, output_final_state=False,
              cu_seqlens=None):
    """Chunked gated slot attention.

    q, k: [B, T, H, K]; v: [B, T, H, V]; s, g: [B, T, H, M] (g the log gate, <= 0); one dtype
    (fp32, fp16 or bf16), but g may be float32 beside 16-bit inputs. g = None is the ungated
    form: s sets its own decay (`ops/gsa/gate.py`). initial_state: None or (hk [B, H, K, M],
    hv [B, H, M, V]) float32. scale defaults to K ** -0.5. Returns (o [B, T, H, V] in the
    inputs' dtype, (hk, hv) float32 or None); differentiable in every tensor. cu_seqlens: None,
    or int32 / int64 [N + 1], the cumulative starts of N sequences packed along T (B = 1), each
    run on its own: initial and final states ([N, H, K, M], [N, H, M, V]).
    """
    return apply_gsa("chunk_gsa", ChunkGSAFunction, q, k, v, s, g, scale, initial_state,
                     output_final_state, cu_seqlens, BT)
