"""Gated slot attention, chunked: two gated linear recurrences with the softmax between them.

Per (batch, head), with M slots, hk [K, M], hv [M, V] and z_t = scale q_t hk_t:
    hk_t = hk_{t-1} diag(exp(g_t)) + k_t^T s_t,  hv_t = diag(exp(g_t)) hv_{t-1} + s_t^T v_t
    p_t = softmax(z_t),  o_t = p_t hv_t
Written with the slot dimension first, both states follow S_t = diag(exp(g_t)) S_{t-1} + s_t^T b_t
(b = k for hk^T [M, K], b = v for hv), so `chunk_fwd_h` / `chunk_bwd_dh` (ops/common/chunk_state.py)
carry them from chunk to chunk of BT = 64 rows with keys s, gate sums per sub-chunk of BC = 16
rows (`block_gate_sums`). One program per sub-chunk I of a chunk c. With P_I the inclusive prefix
sum of g inside I, pre / post the totals of the sub-chunks before / after I in the chunk, w_ij =
exp(g_{j+1} + ... + g_i) and hk^T_c, hv_c the states entering the chunk, for rows i of I:
    z_i = scale (exp(P_i + pre) * (hk^T_c q_i) + sum_{j <= i} (q_i . k_j) s_j w_ij)
    o_i = (p_i * exp(P_i + pre)) hv_c + sum_{j <= i} C_ij v_j,   C_ij = sum_m p_im s_jm w_ijm
Pairs in an earlier sub-chunk J are dots whose factors carry exp(P_I) and exp(Q_J + between)
(`suffix_to`), the pairs inside I dots per level of `diag_level_sums`; the pair (i, i) has no
gate. Every exponent is a sum of non-positive gates or stored gate sums, never a difference:
nothing overflows, and strong decays keep their precision. Products take tf32 operands rounded to nearest for 16-bit inputs
(`mma`) and IEEE fp32 ones for fp32 inputs.

Forward:  block_gate_sums -> chunk_fwd_h (hk^T, hv) -> _fwd_kernel (p, o).
Backward: the same, then chunk_bwd_dh for hv (queries p) -> _bwd_dz_kernel (dp, the softmax
          backward dz = p (dp - <p, dp>), the dg readout sums y') -> chunk_bwd_dh for hk^T
          (queries dz, values q) -> _bwd_dq_kernel (dq) -> _bwd_keys_kernel twice, for hk^T
          (dk) then hv (dv), each adding its share of ds, ds' and boundary' -> chunk_gate_grad.

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

from fla_kernels.ops.common.chunk_state import (between_total, block_gate_sums, chunk_bwd_dh,
                                                chunk_fwd_h, diag_level_sums, exp_nonpos,
                                                load_prefix, load_suffix, suffix_to)
from fla_kernels.ops.common.dot import mma, product_settings
from fla_kernels.ops.common.gate_grad import chunk_gate_grad
from fla_kernels.ops.common.tiles import load_rows, load_state, store_rows
from fla_kernels.ops.gsa.fused_recurrent import apply_gsa
from fla_kernels.utils import store_dtype

BT = 64  # tokens per chunk: the states are stored at chunk starts
BC = 16  # tokens per sub-chunk (one gate block), one program each
NC = BT // BC
# every kernel: four warps, two pipeline stages (H100, B=8, T=2048, H=16, K=V=128, M=64, bf16;
# benchmarks/tuning.md)
LAUNCH = dict(num_warps=4, num_stages=2)
LEVELS = BC.bit_length() - 1  # the levels of `diag_level_sums` in a block of BC rows


@triton.jit
def _entering_gate(P, base_m, c0, i_s, T, H: tl.constexpr, M: tl.constexpr, BC: tl.constexpr,
                   BM: tl.constexpr):
    """(P_I [BC, BM], the inclusive prefix inside sub-chunk I = i_s of the chunk at c0, and
    exp(P_I + pre) [BC, BM], the gate from the chunk's start through each row)."""
    b_P = load_prefix(P, base_m, c0 + i_s * BC, T, H, M, BC, BM, 0, BC, False)
    b_pre = between_total(P, base_m, c0, T, H, M, BC, BM, 0, 0, i_s)
    return b_P, exp_nonpos(b_P + b_pre[None, :])


@triton.jit
def _later(w, w_scale, P, Q, base_m, c0, i_j, i_i, T, H: tl.constexpr, M: tl.constexpr,
           BC: tl.constexpr, BM: tl.constexpr):
    """(w_I * w_scale * exp(P_I), exp(the gate after each row of J up to the start of I)), both
    [BC, BM], for sub-chunks J = i_j < I = i_i of the chunk at c0: the pair (i, j) decays by
    the product of the two."""
    t_i = c0 + i_i * BC
    b_wP = load_rows(w, base_m, t_i, T, H, M, BC, BM, 0) * w_scale * exp_nonpos(
        load_prefix(P, base_m, t_i, T, H, M, BC, BM, 0, BC, False))
    return b_wP, exp_nonpos(suffix_to(P, Q, base_m, c0, T, H, M, BC, BM, 0, i_j, i_i))


@triton.jit
def _scores(x, y, base, t_x, t_y, T, H: tl.constexpr, D: tl.constexpr, BC: tl.constexpr,
            BS: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """[BC, BC] x_i . y_j for the rows i from t_x of x and j from t_y of y ([B, T, H, D] at the
    same offsets), summed over column blocks of BS."""
    b_A = tl.zeros([BC, BC], dtype=tl.float32)
    for i_d in range(tl.cdiv(D, BS)):
        b_A += mma(load_rows(x, base, t_x, T, H, D, BC, BS, i_d),
                   tl.trans(load_rows(y, base, t_y, T, H, D, BC, BS, i_d)), FP32_DOT, OPERAND_DTYPE)
    return b_A


@triton.jit
def _diagonal(b_A, BC: tl.constexpr):
    """[BC] the diagonal of a [BC, BC] tile."""
    o_i = tl.arange(0, BC)
    return tl.sum(tl.where(o_i[:, None] == o_i[None, :], b_A, 0.0), axis=1)


@triton.jit
def _diag_weights(w, b_s, b_g, BC: tl.constexpr, LEVELS: tl.constexpr, FP32_DOT: tl.constexpr,
                  OPERAND_DTYPE: tl.constexpr):
    """[BC, BC] C_ij = sum_m w_im s_jm w_ijm for the pairs j <= i of a sub-chunk with gates b_g."""
    o_i = tl.arange(0, BC)
    b_C = tl.where(o_i[:, None] == o_i[None, :], tl.sum(w * b_s, axis=1)[:, None], 0.0)
    for lvl in tl.static_range(LEVELS):
        f_row, f_col, pairs = diag_level_sums(b_g, BC, 1 << lvl, FP32_DOT, OPERAND_DTYPE)
        b_C += tl.where(pairs, mma(w * f_row, tl.trans(b_s * f_col), FP32_DOT, OPERAND_DTYPE), 0.0)
    return b_C


@triton.jit
def _readout(x, y, s, g, P, Q, states, index, base, base_m, c0, i_s, T, H: tl.constexpr,
             D: tl.constexpr, M: tl.constexpr, BC: tl.constexpr, BD: tl.constexpr, BS: tl.constexpr,
             BM: tl.constexpr, LEVELS: tl.constexpr, FP32_DOT: tl.constexpr,
             OPERAND_DTYPE: tl.constexpr):
    """(r', r_ii) [BC, BM] for the rows i of sub-chunk I = i_s of the chunk at c0:
    r'_i = exp(P_i + pre) (S x_i^T) + sum_{j < i} (x_i . y_j) s_j w_ij, and the gate-free pair
    r_ii = (x_i . y_i) s_i. x, y [B, T, H, D], their scores summed over column blocks of BS;
    S = states[index] [M, D], entering the chunk, read in column blocks of BD (a whole [64, 128]
    float32 tile holds 64 registers)."""
    t_i = c0 + i_s * BC
    b_P, b_in = _entering_gate(P, base_m, c0, i_s, T, H, M, BC, BM)
    b_r = tl.zeros([BC, BM], dtype=tl.float32)
    for i_d in range(tl.cdiv(D, BD)):
        b_r += mma(load_rows(x, base, t_i, T, H, D, BC, BD, i_d),
                   tl.trans(load_state(states, index, M, D, BM, BD, 0, i_d, False)), FP32_DOT,
                   OPERAND_DTYPE)
    b_r *= b_in
    b_eP = exp_nonpos(b_P)
    for i_j in range(i_s):
        t_j = c0 + i_j * BC
        b_A = _scores(x, y, base, t_i, t_j, T, H, D, BC, BS, FP32_DOT, OPERAND_DTYPE)
        b_sj = load_rows(s, base_m, t_j, T, H, M, BC, BM, 0) * exp_nonpos(
            suffix_to(P, Q, base_m, c0, T, H, M, BC, BM, 0, i_j, i_s))
        b_r += b_eP * mma(b_A, b_sj, FP32_DOT, OPERAND_DTYPE)
    b_s = load_rows(s, base_m, t_i, T, H, M, BC, BM, 0)
    b_A = _scores(x, y, base, t_i, t_i, T, H, D, BC, BS, FP32_DOT, OPERAND_DTYPE)
    b_g = load_rows(g, base_m, t_i, T, H, M, BC, BM, 0)
    for lvl in tl.static_range(LEVELS):
        f_row, f_col, pairs = diag_level_sums(b_g, BC, 1 << lvl, FP32_DOT, OPERAND_DTYPE)
        b_r += f_row * mma(tl.where(pairs, b_A, 0.0), b_s * f_col, FP32_DOT, OPERAND_DTYPE)
    return b_r, _diagonal(b_A, BC)[:, None] * b_s


@triton.jit
def _mix(w, y, s, g, P, Q, states, index, base, base_m, c0, i_s, T, H: tl.constexpr,
         D: tl.constexpr, M: tl.constexpr, BC: tl.constexpr, BW: tl.constexpr, BM: tl.constexpr,
         LEVELS: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """[BC, BW] (w_I * exp(P_I + pre)) S + sum_{j <= i} C_ij y_j, with C_ij = sum_m w_im s_jm w_ijm,
    for the rows of sub-chunk I = i_s of the chunk at c0. w [BC, BM]; S = states[index] [M, D],
    entering the chunk, read whole (column blocks, which recompute C, measured slower)."""
    t_i = c0 + i_s * BC
    b_P, b_in = _entering_gate(P, base_m, c0, i_s, T, H, M, BC, BM)
    b_r = mma(w * b_in, load_state(states, index, M, D, BM, BW, 0, 0, False), FP32_DOT,
              OPERAND_DTYPE)
    b_wP = w * exp_nonpos(b_P)
    for i_j in range(i_s):
        t_j = c0 + i_j * BC
        b_sj = load_rows(s, base_m, t_j, T, H, M, BC, BM, 0) * exp_nonpos(
            suffix_to(P, Q, base_m, c0, T, H, M, BC, BM, 0, i_j, i_s))
        b_C = mma(b_wP, tl.trans(b_sj), FP32_DOT, OPERAND_DTYPE)
        b_r += mma(b_C, load_rows(y, base, t_j, T, H, D, BC, BW, 0), FP32_DOT, OPERAND_DTYPE)
    b_s = load_rows(s, base_m, t_i, T, H, M, BC, BM, 0)
    b_C = _diag_weights(w, b_s, load_rows(g, base_m, t_i, T, H, M, BC, BM, 0), BC, LEVELS, FP32_DOT,
                        OPERAND_DTYPE)
    return b_r + mma(b_C, load_rows(y, base, t_i, T, H, D, BC, BW, 0), FP32_DOT, OPERAND_DTYPE)


@triton.jit(do_not_specialize=["T", "NT"])
def _fwd_kernel(q, k, v, s, g, P, Q, states_k, states_v, p, o, scale, T, NT, H: tl.constexpr,
                K: tl.constexpr, V: tl.constexpr, M: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                BK: tl.constexpr, BVW: tl.constexpr, BM: tl.constexpr,
                LEVELS: tl.constexpr, STORE_O: tl.constexpr, FP32_DOT: tl.constexpr,
                OPERAND_DTYPE: tl.constexpr):
    """p [B, T, H, M] float32 and (STORE_O) o [B, T, H, V], one program per (sub-chunk, b*h).
    BK: the column block of hk^T and of the scores q k^T (faster than whole rows here, not in
    the dz kernel: benchmarks/tuning.md); BVW: the whole (power-of-two) V."""
    NC: tl.constexpr = BT // BC
    i_t, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    base_k, base_v, base_m = (i_b * T * H + i_h) * K, (i_b * T * H + i_h) * V, (i_b * T * H + i_h) * M
    i_c, i_s = i_t // NC, i_t % NC
    c0, t_i = i_c * BT, i_t * BC
    index = i_bh * NT + i_c
    b_z, b_zd = _readout(q, k, s, g, P, Q, states_k, index, base_k, base_m, c0, i_s, T, H, K, M, BC, BK,
                         BK, BM, LEVELS, FP32_DOT, OPERAND_DTYPE)
    m_m = tl.arange(0, BM) < M
    b_z = tl.where(m_m[None, :], (b_z + b_zd) * scale, float("-inf"))
    b_e = tl.exp(b_z - tl.max(b_z, axis=1)[:, None])
    b_p = b_e / tl.sum(b_e, axis=1)[:, None]
    store_rows(p, b_p, base_m, t_i, T, H, M, BC, BM, 0)
    if STORE_O:
        b_o = _mix(b_p, v, s, g, P, Q, states_v, index, base_v, base_m, c0, i_s, T, H, V, M, BC, BVW, BM,
                   LEVELS, FP32_DOT, OPERAND_DTYPE)
        store_rows(o, b_o, base_v, t_i, T, H, V, BC, BVW, 0)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_dz_kernel(q, k, v, s, g, P, Q, p, do, states_k, states_v, dz, y, scale, T, NT,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
                   BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   BKW: tl.constexpr, BVW: tl.constexpr, BM: tl.constexpr, LEVELS: tl.constexpr,
                   NEED_DG: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """dz = p (dp - <p, dp>) with dp_i = hv_i do_i and, with NEED_DG, y' = dz z' + p dp'
    ([B, T, H, M] float32), one program per (sub-chunk, b*h). BK, BV: the column blocks of the
    states; BKW, BVW: the whole K and V."""
    NC: tl.constexpr = BT // BC
    i_t, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    base_k, base_v, base_m = (i_b * T * H + i_h) * K, (i_b * T * H + i_h) * V, (i_b * T * H + i_h) * M
    i_c, i_s = i_t // NC, i_t % NC
    c0, t_i = i_c * BT, i_t * BC
    index = i_bh * NT + i_c
    b_dpm, b_dpd = _readout(do, v, s, g, P, Q, states_v, index, base_v, base_m, c0, i_s, T, H, V, M, BC,
                            BV, BVW, BM, LEVELS, FP32_DOT, OPERAND_DTYPE)
    b_p = load_rows(p, base_m, t_i, T, H, M, BC, BM, 0)
    b_dp = b_dpm + b_dpd
    b_dz = b_p * (b_dp - tl.sum(b_p * b_dp, axis=1)[:, None])
    store_rows(dz, b_dz, base_m, t_i, T, H, M, BC, BM, 0)
    if NEED_DG:
        b_zm, _ = _readout(q, k, s, g, P, Q, states_k, index, base_k, base_m, c0, i_s, T, H, K, M, BC, BK,
                           BKW, BM, LEVELS, FP32_DOT, OPERAND_DTYPE)
        store_rows(y, b_dz * b_zm * scale + b_p * b_dpm, base_m, t_i, T, H, M, BC, BM, 0)


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
def _bwd_dq_kernel(k, s, g, P, Q, dz, states_k, dq, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                   M: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BKW: tl.constexpr,
                   BM: tl.constexpr, LEVELS: tl.constexpr, FP32_DOT: tl.constexpr,
                   OPERAND_DTYPE: tl.constexpr):
    """dq_i = scale sum_m dz_im (d z_im / d q_i): through the state entering the chunk and the rows
    j <= i, one program per (sub-chunk, b*h)."""
    NC: tl.constexpr = BT // BC
    i_t, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    base_k, base_m = (i_b * T * H + i_h) * K, (i_b * T * H + i_h) * M
    i_c, i_s = i_t // NC, i_t % NC
    t0 = i_t * BC
    b_dz = load_rows(dz, base_m, t0, T, H, M, BC, BM, 0) * scale
    b_dq = _mix(b_dz, k, s, g, P, Q, states_k, i_bh * NT + i_c, base_k, base_m, i_c * BT, i_s, T, H, K, M,
                BC, BKW, BM, LEVELS, FP32_DOT, OPERAND_DTYPE)
    store_rows(dq, b_dq, base_k, t0, T, H, K, BC, BKW, 0)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_keys_kernel(x, w, y, s, g, P, Q, states, dh, dy, ds_acc, ds, dsm, parts, w_scale, T, NT,
                     H: tl.constexpr, D: tl.constexpr, M: tl.constexpr, BT: tl.constexpr,
                     BC: tl.constexpr, BD: tl.constexpr, BW: tl.constexpr, BM: tl.constexpr,
                     LEVELS: tl.constexpr, FIRST: tl.constexpr, LAST: tl.constexpr, NEED_DG: tl.constexpr,
                     FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """The gradients of the rows j of sub-chunk J as keys of one of the two recurrences, one program
    per (sub-chunk, b*h): (x, w, y, states, dh) = (q, dz, k, hk^T, dhk) with w_scale = scale, or
    (do, p, v, hv, dhv) with w_scale = 1. dh [B, H, NT, M, D]: the gradients w.r.t. the states
    leaving each chunk (slot dimension first), read in column blocks of BD; BW: the whole D.

    dy = d y (dk or dv) through the leaving state, the later sub-chunks and J's own block. The
    recurrence's share of ds, and with NEED_DG of ds' [B, T, H, M] and of J's part of boundary'
    [B, H, NT * NC, M] (both float32), is added to what an earlier pass left (unless FIRST) and
    left in ds_acc (float32) for the next pass or, when LAST, stored in ds (s's dtype)."""
    NC: tl.constexpr = BT // BC
    i_t, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    base, base_m = (i_b * T * H + i_h) * D, (i_b * T * H + i_h) * M
    i_c, i_s = i_t // NC, i_t % NC
    c0, t0 = i_c * BT, i_t * BC
    index = i_bh * NT + i_c
    b_w = load_rows(w, base_m, t0, T, H, M, BC, BM, 0) * w_scale
    b_s = load_rows(s, base_m, t0, T, H, M, BC, BM, 0)
    b_out = exp_nonpos(load_suffix(Q, base_m, t0, T, H, M, BC, BM, 0)
                       + between_total(P, base_m, c0, T, H, M, BC, BM, 0, i_s + 1, NC)[None, :])
    b_sO = b_s * b_out
    b_g = load_rows(g, base_m, t0, T, H, M, BC, BM, 0)
    b_C = _diag_weights(b_w, b_s, b_g, BC, LEVELS, FP32_DOT, OPERAND_DTYPE)
    b_leave = tl.zeros([BC, BM], dtype=tl.float32)
    for i_d in range(tl.cdiv(D, BD)):
        b_dh = load_state(dh, index, M, D, BM, BD, 0, i_d, False)
        b_leave += mma(load_rows(y, base, t0, T, H, D, BC, BD, i_d), tl.trans(b_dh), FP32_DOT,
                       OPERAND_DTYPE)
        b_dy = mma(b_sO, b_dh, FP32_DOT, OPERAND_DTYPE) + mma(
            tl.trans(b_C), load_rows(x, base, t0, T, H, D, BC, BD, i_d), FP32_DOT, OPERAND_DTYPE)
        for i_i in range(i_s + 1, NC):
            b_wP, b_to = _later(w, w_scale, P, Q, base_m, c0, i_s, i_i, T, H, M, BC, BM)
            b_Ci = mma(b_wP, tl.trans(b_s * b_to), FP32_DOT, OPERAND_DTYPE)
            b_dy += mma(tl.trans(b_Ci), load_rows(x, base, c0 + i_i * BC, T, H, D, BC, BD, i_d),
                        FP32_DOT, OPERAND_DTYPE)
        store_rows(dy, b_dy, base, t0, T, H, D, BC, BD, i_d)
    b_leave *= b_out
    # ds through the pairs (i, j) with i > j: the later sub-chunks, then the own block by levels
    b_ds_in = tl.zeros([BC, BM], dtype=tl.float32)
    for i_i in range(i_s + 1, NC):
        b_wP, b_to = _later(w, w_scale, P, Q, base_m, c0, i_s, i_i, T, H, M, BC, BM)
        b_A = _scores(x, y, base, c0 + i_i * BC, t0, T, H, D, BC, BW, FP32_DOT, OPERAND_DTYPE)
        b_ds_in += b_to * mma(tl.trans(b_A), b_wP, FP32_DOT, OPERAND_DTYPE)
    b_A = _scores(x, y, base, t0, t0, T, H, D, BC, BW, FP32_DOT, OPERAND_DTYPE)
    for lvl in tl.static_range(LEVELS):
        f_row, f_col, pairs = diag_level_sums(b_g, BC, 1 << lvl, FP32_DOT, OPERAND_DTYPE)
        b_ds_in += f_col * mma(tl.trans(tl.where(pairs, b_A, 0.0)), b_w * f_row, FP32_DOT, OPERAND_DTYPE)
    b_ds = b_ds_in + _diagonal(b_A, BC)[:, None] * b_w + b_leave
    if not FIRST:
        b_ds += load_rows(ds_acc, base_m, t0, T, H, M, BC, BM, 0)
    if LAST:
        store_rows(ds, b_ds, base_m, t0, T, H, M, BC, BM, 0)
    else:
        store_rows(ds_acc, b_ds, base_m, t0, T, H, M, BC, BM, 0)
    if NEED_DG:
        is_last = (t0 + tl.arange(0, BC) == tl.minimum(c0 + BT, T) - 1)[:, None]
        b_leave = tl.where(is_last, 0.0, b_leave)
        b_dsm = b_ds_in + b_leave
        # boundary' = exp(total) <S_c, dS_leaving> + sum_{u < L} s_u (u's path into S_leaving)
        b_bound = tl.sum(b_s * b_leave, axis=0)
        if i_s == 0:
            b_tot = between_total(P, base_m, c0, T, H, M, BC, BM, 0, 0, NC)
            b_bound += exp_nonpos(b_tot) * _state_inner(states, dh, index, M, D, BM, BD)
        o_m = tl.arange(0, BM)
        p_parts = parts + (i_bh * NT * NC + i_t) * M + o_m
        if not FIRST:
            b_dsm += load_rows(dsm, base_m, t0, T, H, M, BC, BM, 0)
            b_bound += tl.load(p_parts, mask=o_m < M, other=0)
        store_rows(dsm, b_dsm, base_m, t0, T, H, M, BC, BM, 0)
        tl.store(p_parts, b_bound, mask=o_m < M)


def _pow2(n):
    return max(16, triton.next_power_of_2(n))


class _Launch:
    """Shapes, block sizes and dot settings shared by the launches of one call."""

    def __init__(self, q, v, s):
        self.B, self.T, self.H, self.K = q.shape
        self.V, self.M = v.shape[-1], s.shape[-1]
        self.NT = triton.cdiv(self.T, BT)
        self.NS = triton.cdiv(self.T, BC)
        # K and V are read in column blocks of up to 64 (a whole [64, 128] float32 state tile
        # held 64 registers more), the M slots whole (the softmax needs every slot)
        self.BKW, self.BVW, self.BM = _pow2(self.K), _pow2(self.V), _pow2(self.M)
        self.BK, self.BV = min(64, self.BKW), min(64, self.BVW)
        # 16-bit inputs take tf32 products with operands rounded to nearest (`mma`), fp32 inputs
        # IEEE ones. With bf16 tensor-core operands (the fp32 states and the softmax terms rounded
        # to bf16) dg reached 5.2 floors at T=1000, M=64, strong gates on the H100, over the
        # bound; tf32 keeps 3 more bits.
        settings = product_settings(q.dtype, tf32=True)
        self.fp32_dot, self.operand_dtype = settings["FP32_DOT"], settings["OPERAND_DTYPE"]

    def kw(self, **sizes):
        """The launch keywords every kernel takes, plus `sizes`."""
        return dict(H=self.H, M=self.M, BT=BT, BC=BC, BM=self.BM, LEVELS=LEVELS, FP32_DOT=self.fp32_dot,
                    OPERAND_DTYPE=self.operand_dtype, **LAUNCH, **sizes)


def _states(L, q, k, v, s, gates, hk0, hv0):
    """((hk^T states [B, H, NT, M, K], final hk^T), (hv states [B, H, NT, M, V], final hv)),
    float32."""
    hk0t = None if hk0 is None else hk0.to(torch.float32).transpose(-1, -2).contiguous()
    hv0 = None if hv0 is None else hv0.to(torch.float32).contiguous()
    states_k = chunk_fwd_h(s, k, gates, hk0t, BT, BC, L.fp32_dot, L.operand_dtype)
    states_v = chunk_fwd_h(s, v, gates, hv0, BT, BC, L.fp32_dot, L.operand_dtype)
    return states_k, states_v


def _forward(L, q, k, v, s, g, gates, scale, hk0, hv0, store_o=True):
    """(o or None, p [B, T, H, M] float32, (states_k, final_k), (states_v, final_v))."""
    (states_k, final_k), (states_v, final_v) = _states(L, q, k, v, s, gates, hk0, hv0)
    p = torch.empty(L.B, L.T, L.H, L.M, dtype=torch.float32, device=q.device)
    o = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=v.device) if store_o else None
    _fwd_kernel[(L.NS, L.B * L.H)](q, k, v, s, g, *gates, states_k, states_v, p, o, scale, L.T, L.NT,
                                   STORE_O=store_o, **L.kw(K=L.K, V=L.V, BK=L.BK, BVW=L.BVW))
    return o, p, (states_k, final_k), (states_v, final_v)


class ChunkGSAFunction(torch.autograd.Function):
    """Autograd wrapper: saves only the inputs; backward recomputes gate sums, states and p."""

    @staticmethod
    def forward(ctx, q, k, v, s, g, scale, hk0, hv0, output_final_state):
        q, k, v, s, g = (x.contiguous() for x in (q, k, v, s, g))
        L = _Launch(q, v, s)
        gates = block_gate_sums(g, BC)
        o, _, (_, final_k), (_, final_v) = _forward(L, q, k, v, s, g, gates, scale, hk0, hv0)
        hkt = hvt = None
        if output_final_state:
            hkt = final_k.transpose(-1, -2).contiguous()
            hvt = final_v
        ctx.save_for_backward(q, k, v, s, g, hk0, hv0)
        ctx.scale = scale
        ctx.set_materialize_grads(False)
        return o.to(v.dtype), hkt, hvt

    @staticmethod
    def backward(ctx, do, dhkt, dhvt):
        q, k, v, s, g, hk0, hv0 = ctx.saved_tensors
        need_q, need_k, need_v, need_s, need_g, _, need_hk0, need_hv0, _ = ctx.needs_input_grad
        scale = ctx.scale
        L = _Launch(q, v, s)
        f32 = dict(dtype=torch.float32, device=q.device)
        do = torch.zeros_like(v) if do is None else do.contiguous()
        use_h0 = hk0 is not None
        gates = block_gate_sums(g, BC)
        _, p, (states_k, _), (states_v, _) = _forward(L, q, k, v, s, g, gates, scale, hk0, hv0,
                                                      store_o=False)
        dots = dict(fp32_dot=L.fp32_dot, operand_dtype=L.operand_dtype)
        dhvt = None if dhvt is None else dhvt.to(torch.float32).contiguous()
        dhv, dhv0 = chunk_bwd_dh(p, gates, do, dhvt, 1.0, BT, BC, q_gate_exclusive=False,
                                 need_dh0=use_h0, **dots)
        dz = torch.empty(L.B, L.T, L.H, L.M, **f32)
        y = torch.empty_like(dz) if need_g else dz  # dz: a stand-in, never written
        grid = (L.NS, L.B * L.H)
        _bwd_dz_kernel[grid](q, k, v, s, g, *gates, p, do, states_k, states_v, dz, y, scale, L.T, L.NT,
                             NEED_DG=need_g, **L.kw(K=L.K, V=L.V, BK=L.BK, BV=L.BV, BKW=L.BKW,
                                                    BVW=L.BVW))
        dhkt_t = None if dhkt is None else dhkt.to(torch.float32).transpose(-1, -2).contiguous()
        dhk, dhk0 = chunk_bwd_dh(dz, gates, q, dhkt_t, scale, BT, BC, q_gate_exclusive=False,
                                 need_dh0=use_h0, **dots)
        dq, dk, dv, ds = (torch.empty(x.shape, dtype=store_dtype(x.dtype), device=x.device)
                          for x in (q, k, v, s))
        _bwd_dq_kernel[grid](k, s, g, *gates, dz, states_k, dq, scale, L.T, L.NT, **L.kw(K=L.K, BKW=L.BKW))
        ds_acc = torch.empty_like(dz)
        dsm = torch.empty_like(dz) if need_g else dz  # dz: a stand-in, never written
        # one part of boundary' per sub-chunk, summed per chunk below (no atomics: deterministic)
        parts = torch.zeros(L.B, L.H, L.NT * NC, L.M, **f32) if need_g else None
        for x, w, w_scale, b, states, dh, db, first in ((q, dz, scale, k, states_k, dhk, dk, True),
                                                         (do, p, 1.0, v, states_v, dhv, dv, False)):
            _bwd_keys_kernel[grid](x, w, b, s, g, *gates, states, dh, db, ds_acc, ds, dsm, parts, w_scale,
                                   L.T, L.NT, FIRST=first, LAST=not first, NEED_DG=need_g,
                                   **L.kw(D=x.shape[-1], BD=L.BK if first else L.BV,
                                          BW=L.BKW if first else L.BVW))
        dg = None
        if need_g:
            bound = parts.view(L.B, L.H, L.NT, NC, L.M).sum(3)
            dg = chunk_gate_grad(y, torch.ones_like(y), s, dsm, bound, BT, q_reads_current=True,
                                 out_dtype=store_dtype(g.dtype)).to(g.dtype)
        return (
            dq.to(q.dtype) if need_q else None,
            dk.to(k.dtype) if need_k else None,
            dv.to(v.dtype) if need_v else None,
            ds.to(s.dtype) if need_s else None,
            dg,
            None,
            dhk0.transpose(-1, -2).contiguous().to(hk0.dtype) if need_hk0 and use_h0 else None,
            dhv0.to(hv0.dtype) if need_hv0 and use_h0 else None,
            None,
        )


def chunk_gsa(q, k, v, s, g, scale=None, initial_state=None, output_final_state=False):
    """Chunked gated slot attention.

    q, k: [B, T, H, K]; v: [B, T, H, V]; s, g: [B, T, H, M] (g the log gate, <= 0); one dtype
    (fp32, fp16 or bf16). initial_state: None or (hk [B, H, K, M], hv [B, H, M, V]) float32.
    scale defaults to K ** -0.5. Returns (o [B, T, H, V] in the inputs' dtype, (hk, hv) float32
    or None); differentiable in every tensor.
    """
    return apply_gsa("chunk_gsa", ChunkGSAFunction, q, k, v, s, g, scale, initial_state,
                     output_final_state)
