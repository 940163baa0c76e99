"""Gated slot attention, chunked: two gated linear recurrences with the softmax between them.

Per (batch, head), with M slots, hk [K, M], hv [M, V] and z_t = scale q_t hk_t:
    hk_t = hk_{t-1} diag(exp(g_t)) + k_t^T s_t,  hv_t = diag(exp(g_t)) hv_{t-1} + s_t^T v_t
    p_t = softmax(z_t),  o_t = p_t hv_t
Written with the slot dimension first, both states follow S_t = diag(exp(g_t)) S_{t-1} + s_t^T b_t
(b = k for hk^T [M, K], b = v for hv), so `chunk_fwd_h` / `chunk_bwd_dh` (ops/common/chunk_state.py)
carry them from chunk to chunk with keys s. Inside chunk c (BT = 16 rows i, j; P_i the inclusive
chunk-local prefix sum of g, Q_j the exclusive suffix sum, both [M] and <= 0; hk^T_c, hv_c the
states entering the chunk):
    z_i = scale (exp(P_i) * (hk^T_c q_i) + sum_{j <= i} (q_i . k_j) s_j exp(P_i - P_j))
    o_i = (p_i * exp(P_i)) hv_c + sum_{j <= i} A_ij v_j,   A_ij = sum_m p_im s_jm exp(P_im - P_jm)
Every exponent is a sum of gates over rows of one chunk (<= 0, clamped): nothing overflows. The
intra-chunk sums run element-wise over one column j at a time; the chunk-state products are dots.

Forward:  block_gate_sums -> chunk_fwd_h (hk^T, hv) -> _fwd_kernel (p, o).
Backward: the same, then chunk_bwd_dh for hv (queries p) -> _bwd_dz_kernel (dp, the softmax
          backward dz = p (dp - <p, dp>), the dg readout sums y') -> chunk_bwd_dh for hk^T
          (queries dz, values q) -> _bwd_kernel (dq, dk, dv, ds, ds', boundary') -> chunk_gate_grad.

dg follows fused_recurrent.py's module docstring: per chunk,
    dg_t = boundary' + sum_{t <= u <= L} y'_u - sum_{t <= u < L} s_u * ds'_u
with y'_u = dz_u * z'_u + p_u * dp'_u, where z', dp' are z and dp without the pair (u, u), ds'_u
is ds_u without the pairs (i = u) and, for the chunk's last row L, without its path into the
leaving state, and boundary' = sum (S_L - s_L^T b_L) * dS_leaving over both states: every term
carries a gate, so dg keeps its precision under strong decay.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.chunk_state import (block_gate_sums, block_total, chunk_bwd_dh, chunk_fwd_h,
                                                exp_nonpos, load_prefix, load_suffix)
from fla_kernels.ops.common.dot import mma, product_settings
from fla_kernels.ops.common.gate_grad import chunk_gate_grad
from fla_kernels.ops.gsa.fused_recurrent import apply_gsa
from fla_kernels.utils import store_dtype

BT = 16  # tokens per chunk (one gate block: every exponent is a sum over at most BT gates)

@triton.jit
def _rows(x, base, t0, T, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    """[BR, BD] float32 tile of x [B, T, H, D] at rows t0.. (zero outside)."""
    t = t0 + tl.arange(0, BR)
    d = tl.arange(0, BD)
    offs = base + t.to(tl.int64)[:, None] * (H * D) + d[None, :]
    return tl.load(x + offs, mask=(t[:, None] < T) & (d[None, :] < D), other=0).to(tl.float32)


@triton.jit
def _row(x, base, t, T, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr):
    """[BD] float32 row of x [B, T, H, D] at time t (zero past T)."""
    d = tl.arange(0, BD)
    # a scalar bool and'ed with a vector one trips the triton 3.9 interpreter: fold t < T into the bound
    return tl.load(x + base + t.to(tl.int64) * (H * D) + d, mask=d < tl.where(t < T, D, 0),
                   other=0).to(tl.float32)


@triton.jit
def _store(x, val, base, t0, T, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    """Store a [BR, BD] tile into x [B, T, H, D] at rows t0.., in x's dtype."""
    t = t0 + tl.arange(0, BR)
    d = tl.arange(0, BD)
    offs = base + t.to(tl.int64)[:, None] * (H * D) + d[None, :]
    tl.store(x + offs, val.to(x.dtype.element_ty), mask=(t[:, None] < T) & (d[None, :] < D))


@triton.jit
def _mat(x, index, R: tl.constexpr, C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """[BR, BC] float32 block of the [R, C] matrix number `index` of x (zero outside)."""
    o_r = tl.arange(0, BR)
    o_c = tl.arange(0, BC)
    mask = (o_r[:, None] < R) & (o_c[None, :] < C)
    return tl.load(x + index * (R * C) + o_r[:, None] * C + o_c[None, :], mask=mask, other=0).to(tl.float32)


@triton.jit
def _decay_col(b_g, o_i, j, STRICT: tl.constexpr):
    """[BT, BM] exp(g_{j+1} + ... + g_i) for rows i >= j (i > j with STRICT) of the chunk, else 0.

    b_g: the chunk's gates [BT, BM] (zero past T). The exponent is summed from row j + 1 on, not taken
    as a difference of chunk prefix sums: P_i - P_j would carry the rounding of P_j (about
    eps * |P_j|, 1e-5 relative once a strongly decaying chunk sums to -200), which dg feels.
    """
    b_sum = tl.cumsum(tl.where(o_i[:, None] > j, b_g, 0.0), axis=0)
    if STRICT:
        keep = o_i[:, None] > j
    else:
        keep = o_i[:, None] >= j
    return tl.where(keep, exp_nonpos(b_sum), 0.0)


@triton.jit(do_not_specialize=["T", "NT"])
def _fwd_kernel(q, k, v, s, g, P, states_k, states_v, p, o, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                V: tl.constexpr, M: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                BM: tl.constexpr, STORE_O: tl.constexpr, FP32_DOT: tl.constexpr,
                OPERAND_DTYPE: tl.constexpr):
    """p [B, T, H, M] float32 and (STORE_O) o [B, T, H, V], one program per (chunk, b*h)."""
    i_c, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    base_k, base_v, base_m = (i_b * T * H + i_h) * K, (i_b * T * H + i_h) * V, (i_b * T * H + i_h) * M
    c0 = i_c * BT
    o_i = tl.arange(0, BT)
    m_m = tl.arange(0, BM) < M
    b_q = _rows(q, base_k, c0, T, H, K, BT, BK)
    b_P = load_prefix(P, base_m, c0, T, H, M, BT, BM, 0, BT, False)
    b_g = _rows(g, base_m, c0, T, H, M, BT, BM)
    b_hk = _mat(states_k, i_bh * NT + i_c, M, K, BM, BK)           # hk^T entering the chunk
    b_z = mma(b_q, tl.trans(b_hk), FP32_DOT, OPERAND_DTYPE) * exp_nonpos(b_P)
    for j in range(BT):
        b_kj = _row(k, base_k, c0 + j, T, H, K, BK)
        b_sj = _row(s, base_m, c0 + j, T, H, M, BM)
        b_w = _decay_col(b_g, o_i, j, False)
        b_z += tl.sum(b_q * b_kj[None, :], axis=1)[:, None] * b_sj[None, :] * b_w
    b_z = tl.where(m_m[None, :], b_z * scale, float("-inf"))
    b_e = tl.exp(b_z - tl.max(b_z, axis=1)[:, None])
    b_p = b_e / tl.sum(b_e, axis=1)[:, None]
    _store(p, b_p, base_m, c0, T, H, M, BT, BM)
    if STORE_O:
        b_hv = _mat(states_v, i_bh * NT + i_c, M, V, BM, BV)
        b_o = mma(b_p * exp_nonpos(b_P), b_hv, FP32_DOT, OPERAND_DTYPE)
        for j in range(BT):
            b_vj = _row(v, base_v, c0 + j, T, H, V, BV)
            b_sj = _row(s, base_m, c0 + j, T, H, M, BM)
            b_w = _decay_col(b_g, o_i, j, False)
            b_o += tl.sum(b_p * b_sj[None, :] * b_w, axis=1)[:, None] * b_vj[None, :]
        _store(o, b_o, base_v, c0, T, H, V, BT, BV)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_dz_kernel(q, k, v, s, g, P, p, do, states_k, states_v, dz, y, scale, T, NT, H: tl.constexpr,
                   K: tl.constexpr, V: tl.constexpr, M: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                   BV: tl.constexpr, BM: tl.constexpr, NEED_DG: tl.constexpr, FP32_DOT: tl.constexpr,
                   OPERAND_DTYPE: tl.constexpr):
    """dz = p (dp - <p, dp>) with dp_i = hv_i do_i and, with NEED_DG, y' = dz z' + p dp'
    ([B, T, H, M] float32), one program per (chunk, b*h)."""
    i_c, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    base_k, base_v, base_m = (i_b * T * H + i_h) * K, (i_b * T * H + i_h) * V, (i_b * T * H + i_h) * M
    c0 = i_c * BT
    o_i = tl.arange(0, BT)
    b_P = load_prefix(P, base_m, c0, T, H, M, BT, BM, 0, BT, False)
    b_g = _rows(g, base_m, c0, T, H, M, BT, BM)
    b_gate = exp_nonpos(b_P)
    b_do = _rows(do, base_v, c0, T, H, V, BT, BV)
    b_hv = _mat(states_v, i_bh * NT + i_c, M, V, BM, BV)
    b_dpm = mma(b_do, tl.trans(b_hv), FP32_DOT, OPERAND_DTYPE) * b_gate  # dp without the pairs (i, i)
    if NEED_DG:
        b_q = _rows(q, base_k, c0, T, H, K, BT, BK)
        b_hk = _mat(states_k, i_bh * NT + i_c, M, K, BM, BK)
        b_zm = mma(b_q, tl.trans(b_hk), FP32_DOT, OPERAND_DTYPE) * b_gate  # z / scale without (i, i)
    for j in range(BT):
        b_vj = _row(v, base_v, c0 + j, T, H, V, BV)
        b_sj = _row(s, base_m, c0 + j, T, H, M, BM)
        b_w = _decay_col(b_g, o_i, j, True)
        b_dpm += tl.sum(b_do * b_vj[None, :], axis=1)[:, None] * b_sj[None, :] * b_w
        if NEED_DG:
            b_kj = _row(k, base_k, c0 + j, T, H, K, BK)
            b_zm += tl.sum(b_q * b_kj[None, :], axis=1)[:, None] * b_sj[None, :] * b_w
    b_v = _rows(v, base_v, c0, T, H, V, BT, BV)
    b_s = _rows(s, base_m, c0, T, H, M, BT, BM)
    b_p = _rows(p, base_m, c0, T, H, M, BT, BM)
    b_dp = b_dpm + tl.sum(b_do * b_v, axis=1)[:, None] * b_s
    b_dz = b_p * (b_dp - tl.sum(b_p * b_dp, axis=1)[:, None])
    _store(dz, b_dz, base_m, c0, T, H, M, BT, BM)
    if NEED_DG:
        _store(y, b_dz * b_zm * scale + b_p * b_dpm, base_m, c0, T, H, M, BT, BM)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_kernel(q, k, v, s, g, P, Q, p, dz, do, states_k, states_v, dhk, dhv, dq, dk, dv, ds, dsm, bound,
                scale, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
                BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr,
                NEED_DG: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """dq, dk, dv, ds in their dtypes and, with NEED_DG, ds' [B, T, H, M] and boundary'
    [B, H, NT, M] float32, one program per (chunk, b*h). dhk [B, H, NT, M, K], dhv [B, H, NT, M, V]:
    the gradients w.r.t. the states leaving each chunk (slot dimension first)."""
    i_c, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    base_k, base_v, base_m = (i_b * T * H + i_h) * K, (i_b * T * H + i_h) * V, (i_b * T * H + i_h) * M
    c0 = i_c * BT
    o_i = tl.arange(0, BT)
    is_last = (c0 + o_i == tl.minimum(c0 + BT, T) - 1)[:, None]
    b_q = _rows(q, base_k, c0, T, H, K, BT, BK)
    b_k = _rows(k, base_k, c0, T, H, K, BT, BK)
    b_v = _rows(v, base_v, c0, T, H, V, BT, BV)
    b_do = _rows(do, base_v, c0, T, H, V, BT, BV)
    b_s = _rows(s, base_m, c0, T, H, M, BT, BM)
    b_p = _rows(p, base_m, c0, T, H, M, BT, BM)
    b_dz = _rows(dz, base_m, c0, T, H, M, BT, BM)
    b_P = load_prefix(P, base_m, c0, T, H, M, BT, BM, 0, BT, False)
    b_g = _rows(g, base_m, c0, T, H, M, BT, BM)
    b_sQ = b_s * exp_nonpos(load_suffix(Q, base_m, c0, T, H, M, BT, BM, 0))  # s carried to the chunk end

    # through the states entering and leaving the chunk
    b_hk = _mat(states_k, i_bh * NT + i_c, M, K, BM, BK)
    b_dhk = _mat(dhk, i_bh * NT + i_c, M, K, BM, BK)
    b_dhv = _mat(dhv, i_bh * NT + i_c, M, V, BM, BV)
    b_dq = mma(b_dz * exp_nonpos(b_P), b_hk, FP32_DOT, OPERAND_DTYPE) * scale
    b_dk = mma(b_sQ, b_dhk, FP32_DOT, OPERAND_DTYPE)
    b_dv = mma(b_sQ, b_dhv, FP32_DOT, OPERAND_DTYPE)
    b_ds_leave = (mma(b_k, tl.trans(b_dhk), FP32_DOT, OPERAND_DTYPE)
                  + mma(b_v, tl.trans(b_dhv), FP32_DOT, OPERAND_DTYPE)) * exp_nonpos(
                      load_suffix(Q, base_m, c0, T, H, M, BT, BM, 0))
    if NEED_DG:
        # boundary' = sum over both states of (S_leaving - s_L^T b_L) * dS_leaving
        b_tot = exp_nonpos(block_total(P, base_m, c0, T, H, M, BM, 0, BT))
        b_sQm = tl.where(is_last, 0.0, b_sQ)
        b_hv = _mat(states_v, i_bh * NT + i_c, M, V, BM, BV)
        b_xk = b_hk * b_tot[:, None] + mma(tl.trans(b_sQm), b_k, FP32_DOT, OPERAND_DTYPE)
        b_xv = b_hv * b_tot[:, None] + mma(tl.trans(b_sQm), b_v, FP32_DOT, OPERAND_DTYPE)
        o_m = tl.arange(0, BM)
        tl.store(bound + (i_bh * NT + i_c) * M + o_m,
                 tl.sum(b_xk * b_dhk, axis=1) + tl.sum(b_xv * b_dhv, axis=1), mask=o_m < M)

    # inside the chunk, one column j at a time
    b_ds = tl.zeros([BT, BM], dtype=tl.float32)
    b_dsm = tl.zeros([BT, BM], dtype=tl.float32)
    for j in range(BT):
        b_kj = _row(k, base_k, c0 + j, T, H, K, BK)
        b_vj = _row(v, base_v, c0 + j, T, H, V, BV)
        b_sj = _row(s, base_m, c0 + j, T, H, M, BM)
        b_w = _decay_col(b_g, o_i, j, False)
        is_j = o_i[:, None] == j
        b_dA1 = tl.sum(b_dz * b_sj[None, :] * b_w, axis=1) * scale   # dz_i-weighted (q_i . k_j) grads
        b_A2 = tl.sum(b_p * b_sj[None, :] * b_w, axis=1)             # A_ij
        b_dq += b_dA1[:, None] * b_kj[None, :]
        b_dk += tl.where(is_j, tl.sum(b_dA1[:, None] * b_q, axis=0)[None, :], 0.0)
        b_dv += tl.where(is_j, tl.sum(b_A2[:, None] * b_do, axis=0)[None, :], 0.0)
        b_x = (b_dz * (tl.sum(b_q * b_kj[None, :], axis=1) * scale)[:, None]
               + b_p * tl.sum(b_do * b_vj[None, :], axis=1)[:, None]) * b_w
        b_ds += tl.where(is_j, tl.sum(b_x, axis=0)[None, :], 0.0)
        if NEED_DG:
            b_dsm += tl.where(is_j, tl.sum(tl.where(o_i[:, None] > j, b_x, 0.0), axis=0)[None, :], 0.0)
    _store(dq, b_dq, base_k, c0, T, H, K, BT, BK)
    _store(dk, b_dk, base_k, c0, T, H, K, BT, BK)
    _store(dv, b_dv, base_v, c0, T, H, V, BT, BV)
    _store(ds, b_ds + b_ds_leave, base_m, c0, T, H, M, BT, BM)
    if NEED_DG:
        _store(dsm, b_dsm + tl.where(is_last, 0.0, b_ds_leave), base_m, c0, T, H, M, BT, BM)


def _pow2(n):
    return max(16, triton.next_power_of_2(n))


class _Launch:
    """Shapes, block sizes and dot settings shared by the launches of one call."""

    def __init__(self, q, v, s):
        self.B, self.T, self.H, self.K = q.shape
        self.V, self.M = v.shape[-1], s.shape[-1]
        self.NT = triton.cdiv(self.T, BT)
        self.BK, self.BV, self.BM = _pow2(self.K), _pow2(self.V), _pow2(self.M)
        # 16-bit inputs take tf32 products with operands rounded to nearest (`mma`), fp32 inputs
        # IEEE ones. With bf16 tensor-core operands (the fp32 states and the softmax terms rounded
        # to bf16) dg reached 5.2 floors at T=1000, M=64, strong gates on the H100, over the
        # bound; tf32 keeps 3 more bits. On the H100 tf32 took the backward from 61 ms (IEEE
        # products, 2,600 spilled registers) to 8 ms, best with four warps (benchmarks/tuning.md).
        settings = product_settings(q.dtype, tf32=True)
        self.fp32_dot, self.operand_dtype = settings["FP32_DOT"], settings["OPERAND_DTYPE"]
        wide = max(self.BK, self.BV) * self.BM >= 8192
        self.num_warps = 8 if (wide and self.fp32_dot) else 4

    def kw(self):
        return dict(H=self.H, K=self.K, V=self.V, M=self.M, BT=BT, BK=self.BK, BV=self.BV, BM=self.BM,
                    FP32_DOT=self.fp32_dot, OPERAND_DTYPE=self.operand_dtype, num_warps=self.num_warps)


def _states(L, q, k, v, s, gates, hk0, hv0):
    """((hk^T states [B, H, NT, M, K], final hk^T), (hv states [B, H, NT, M, V], final hv)),
    float32."""
    hk0t = None if hk0 is None else hk0.to(torch.float32).transpose(-1, -2).contiguous()
    hv0 = None if hv0 is None else hv0.to(torch.float32).contiguous()
    states_k = chunk_fwd_h(s, k, gates, hk0t, BT, BT, L.fp32_dot, L.operand_dtype)
    states_v = chunk_fwd_h(s, v, gates, hv0, BT, BT, L.fp32_dot, L.operand_dtype)
    return states_k, states_v


def _forward(L, q, k, v, s, g, gates, scale, hk0, hv0, store_o=True):
    """(o or None, p [B, T, H, M] float32, (states_k, final_k), (states_v, final_v))."""
    (states_k, final_k), (states_v, final_v) = _states(L, q, k, v, s, gates, hk0, hv0)
    p = torch.empty(L.B, L.T, L.H, L.M, dtype=torch.float32, device=q.device)
    o = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=v.device) if store_o else None
    _fwd_kernel[(L.NT, L.B * L.H)](q, k, v, s, g, gates[0], states_k, states_v, p, o, scale, L.T, L.NT,
                                   STORE_O=store_o, **L.kw())
    return o, p, (states_k, final_k), (states_v, final_v)


class ChunkGSAFunction(torch.autograd.Function):
    """Autograd wrapper: saves only the inputs; backward recomputes gate sums, states and p."""

    @staticmethod
    def forward(ctx, q, k, v, s, g, scale, hk0, hv0, output_final_state):
        q, k, v, s, g = (x.contiguous() for x in (q, k, v, s, g))
        L = _Launch(q, v, s)
        gates = block_gate_sums(g, BT)
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
        gates = block_gate_sums(g, BT)
        _, p, (states_k, _), (states_v, _) = _forward(L, q, k, v, s, g, gates, scale, hk0, hv0,
                                                      store_o=False)
        dots = dict(fp32_dot=L.fp32_dot, operand_dtype=L.operand_dtype)
        dhvt = None if dhvt is None else dhvt.to(torch.float32).contiguous()
        dhv, dhv0 = chunk_bwd_dh(p, gates, do, dhvt, 1.0, BT, BT, q_gate_exclusive=False,
                                 need_dh0=use_h0, **dots)
        dz = torch.empty(L.B, L.T, L.H, L.M, **f32)
        y = torch.empty_like(dz) if need_g else dz  # dz: a stand-in, never written
        grid = (L.NT, L.B * L.H)
        _bwd_dz_kernel[grid](q, k, v, s, g, gates[0], p, do, states_k, states_v, dz, y, scale, L.T, L.NT,
                             NEED_DG=need_g, **L.kw())
        dhkt_t = None if dhkt is None else dhkt.to(torch.float32).transpose(-1, -2).contiguous()
        dhk, dhk0 = chunk_bwd_dh(dz, gates, q, dhkt_t, scale, BT, BT, q_gate_exclusive=False,
                                 need_dh0=use_h0, **dots)
        dq, dk, dv, ds = (torch.empty(x.shape, dtype=store_dtype(x.dtype), device=x.device)
                          for x in (q, k, v, s))
        dsm = torch.empty_like(dz) if need_g else dz  # dz: a stand-in, never written
        bound = torch.empty(L.B, L.H, L.NT, L.M, **f32) if need_g else None
        _bwd_kernel[grid](q, k, v, s, g, *gates, p, dz, do, states_k, states_v, dhk, dhv, dq, dk, dv, ds,
                          dsm, bound, scale, L.T, L.NT, NEED_DG=need_g, **L.kw())
        dg = None
        if need_g:
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
