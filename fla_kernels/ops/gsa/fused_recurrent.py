"""Gated slot attention, token by token: forward and backward Triton kernels with fp32 states in registers.

Per (batch, head), with M slots, hk [K, M] and hv [M, V]:
    hk_t = hk_{t-1} diag(exp(g_t)) + k_t^T s_t
    hv_t = diag(exp(g_t)) hv_{t-1} + s_t^T v_t
    z_t  = scale q_t hk_t,   p_t = softmax(z_t),   o_t = p_t hv_t

The softmax needs every slot and the whole K reduction, so a program holds all of hk
([BK, BM] with BK, BM covering K, M) and a block of hv:
- `_fwd_kernel`, one program per (V-block, b*h): o and the final states.
- `_bwd_fwd_kernel`, one per b*h (all of V: dp needs the full V reduction), forward in time:
  p, dp_t = hv_t do_t, dz = p * (dp - <p, dp>), dq = scale hk_t dz_t and, when dg is needed,
  the gate sums y' (below) and the states leaving each chunk less their last increment.
- `_bwd_rev_kernel`, one per b*h, backward in time with the state gradients
      Dhk_t = Dhk_{t+1} diag(exp(g_{t+1})) + scale q_t^T dz_t
      Dhv_t = diag(exp(g_{t+1})) Dhv_{t+1} + p_t^T do_t:
  dk_t = Dhk_t s_t, dv_t = s_t Dhv_t, ds_t = k_t Dhk_t + Dhv_t v_t, dhk0, dhv0 and, when dg
  is needed, ds' and the chunk boundary terms (below).

dg. With S standing for either state written with its slot dimension first (hk^T [M, K] or
hv [M, V]), Sm_t = diag(exp(g_t)) S_{t-1} (the state less its increment s_t^T b_t) and
dSm_t = diag(exp(g_{t+1})) dS_{t+1} (the state gradient less the readout of step t),
dg_t = sum over both states and their second axis of Sm_t * dS_t, and the recurrences give
(summed over one chunk of CHUNK tokens, last row L)
    dg_t = boundary' + sum_{t <= u <= L} y'_u - sum_{t <= u < L} s_u * ds'_u
    y'_u = dz_u * (scale q_u Sm^k_u) + p_u * (Sm^v_u do_u)     (the readouts of Sm_u)
    ds'_u = k_u dSm^k_u + dSm^v_u v_u                          (ds_u less the readout of step u)
    boundary' = sum (Sm_L * dSm_L)                             (both states)
Every term carries a gate factor: the gate-free ones (a step's own increment read at that
step) appear in both y and s * ds and are left out of both, so strong decay, which makes
dg tiny while they stay O(1), does not cost dg its precision in float32 (at T = 1 with no
initial state dg is exactly 0). The sums run inside a chunk only (`chunk_gate_grad`), so
their error does not grow with T, and no past state is rebuilt by dividing by a decay.

A packed batch (cu_seqlens) runs on its chunk-aligned row (ops/common/varlen.py): with VARLEN a
program's n*H + h walks the chunks of sequence n alone, from its initial states to its final ones.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common import chunk_gate_grad
from fla_kernels.ops.common.autograd import cast, needed
from fla_kernels.ops.common.launch import compiles_ahead, flat_grid, launch
from fla_kernels.ops.common.tiles import flat_program, initial_block, load_state, store_state
from fla_kernels.ops.common.varlen import Packing, apply_packed, sequence_walk, state_count
from fla_kernels.ops.gsa.gate import additive_gate
from fla_kernels.precision import store_dtype
from fla_kernels.utils import check_inputs

CHUNK = 64  # tokens per chunk of the dg sums


@triton.jit
def _softmax(z, m_m):
    """Softmax of a [BM] row over the valid slots (zero elsewhere)."""
    z = tl.where(m_m, z, float("-inf"))
    e = tl.exp(z - tl.max(z, axis=0))
    return e / tl.sum(e, axis=0)


@triton.jit
def _slot_blocks(i_v, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr, BK: tl.constexpr,
                 BV: tl.constexpr, BM: tl.constexpr):
    """(o_k, o_m, o_v, m_k, m_m, m_v) of a program holding all of K and M and the V-block i_v:
    its columns and their masks."""
    o_k = tl.arange(0, BK)
    o_m = tl.arange(0, BM)
    o_v = i_v * BV + tl.arange(0, BV)
    return o_k, o_m, o_v, o_k < K, o_m < M, o_v < V


@triton.jit
def _initial_states(hk0, hv0, i_bh, i_v, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
                    BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr, USE_HK: tl.constexpr,
                    USE_HV: tl.constexpr):
    """(hk [BK, BM], hv [BM, BV]) float32 a walk starts from: hk0[b, h] ([B, H, K, M]) with USE_HK
    and the V-block i_v of hv0[b, h] ([B, H, M, V]) with USE_HV, zeros otherwise."""
    return (initial_block(hk0, i_bh, K, M, BK, BM, 0, 0, USE_HK, False),
            initial_block(hv0, i_bh, M, V, BM, BV, 0, i_v, USE_HV, False))


@triton.jit
def _token_inputs(q, k, v, s, g, token, scale, K: tl.constexpr, V: tl.constexpr,
                  M: tl.constexpr, o_k, o_m, o_v, m_k, m_m, m_v):
    """(scale q, k, v, s, exp(g)) float32 of the token at the flat index (b * T + t) * H + h."""
    b_q = tl.load(q + token * K + o_k, mask=m_k, other=0).to(tl.float32) * scale
    b_k = tl.load(k + token * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_v = tl.load(v + token * V + o_v, mask=m_v, other=0).to(tl.float32)
    b_s = tl.load(s + token * M + o_m, mask=m_m, other=0).to(tl.float32)
    b_d = tl.exp(tl.load(g + token * M + o_m, mask=m_m, other=0).to(tl.float32))
    return b_q, b_k, b_v, b_s, b_d


@triton.jit(do_not_specialize=["T", "NT"])
def _fwd_kernel(q, k, v, s, g, hk0, hv0, o, hkt, hvt, chunk_offsets, scale, T, NT,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
                BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr,
                USE_H0: tl.constexpr, STORE_HT: tl.constexpr, VARLEN: tl.constexpr):
    """o [B, T, H, V] in o's dtype; hkt [B, H, K, M], hvt [B, H, M, V] float32 when STORE_HT
    (with VARLEN: the tokens of each sequence's chunks, final states [N, ...])."""
    i_v, _, i_bh = flat_program(tl.cdiv(V, BV), 1)
    i_v = i_v.to(tl.int64)
    i_b, i_h, _, c_lo, c_hi = sequence_walk(chunk_offsets, i_bh, NT, H, VARLEN)
    o_k, o_m, o_v, m_k, m_m, m_v = _slot_blocks(i_v, K, V, M, BK, BV, BM)
    b_hk, b_hv = _initial_states(hk0, hv0, i_bh, i_v, K, V, M, BK, BV, BM, USE_H0, USE_H0)
    for t in range(c_lo * BT, tl.minimum(c_hi * BT, T)):
        token = (i_b * T + t) * H + i_h
        b_q, b_k, b_v, b_s, b_d = _token_inputs(q, k, v, s, g, token, scale, K, V, M, o_k, o_m, o_v,
                                                m_k, m_m, m_v)
        b_hk = b_hk * b_d[None, :] + b_k[:, None] * b_s[None, :]
        b_hv = b_hv * b_d[:, None] + b_s[:, None] * b_v[None, :]
        b_p = _softmax(tl.sum(b_q[:, None] * b_hk, axis=0), m_m)
        b_o = tl.sum(b_p[:, None] * b_hv, axis=0)
        tl.store(o + token * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    if STORE_HT:
        # only the first V-block writes hk (a scalar bool and'ed with a block mask trips the interpreter)
        tl.store(hkt + i_bh * K * M + o_k[:, None] * M + o_m[None, :], b_hk,
                 mask=m_k[:, None] & (o_m[None, :] < tl.where(i_v == 0, M, 0)))
        store_state(hvt, i_bh, b_hv, M, V, BM, BV, 0, i_v, False)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_fwd_kernel(q, k, v, s, g, hk0, hv0, do, dq, p, dz, y, stk, stv, chunk_offsets, scale, T,
                    NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, M: tl.constexpr,
                    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr,
                    USE_H0: tl.constexpr, NEED_DG: tl.constexpr, VARLEN: tl.constexpr):
    """Forward in time, one program per b*h. Writes dq (dq's dtype), p and dz [B, T, H, M] float32;
    with NEED_DG also y' [B, T, H, M] and the chunk-leaving states less their last increment,
    stk [B, H, NT, K, M] and stv [B, H, NT, M, V], float32 (see the module docstring)."""
    i_bh = tl.program_id(0).to(tl.int64)
    i_b, i_h, i_row, c_lo, c_hi = sequence_walk(chunk_offsets, i_bh, NT, H, VARLEN)
    o_k, o_m, o_v, m_k, m_m, m_v = _slot_blocks(0, K, V, M, BK, BV, BM)
    b_hk, b_hv = _initial_states(hk0, hv0, i_bh, 0, K, V, M, BK, BV, BM, USE_H0, USE_H0)
    for i_c in range(c_lo, c_hi):
        b_hkm = b_hk
        b_hvm = b_hv
        for j in range(tl.minimum(T - i_c * BT, BT)):
            token = (i_b * T + i_c * BT + j) * H + i_h
            b_q, b_k, b_v, b_s, b_d = _token_inputs(q, k, v, s, g, token, scale, K, V, M, o_k, o_m,
                                                    o_v, m_k, m_m, m_v)
            b_do = tl.load(do + token * V + o_v, mask=m_v, other=0).to(tl.float32)
            b_hkm = b_hk * b_d[None, :]
            b_hvm = b_hv * b_d[:, None]
            b_hk = b_hkm + b_k[:, None] * b_s[None, :]
            b_hv = b_hvm + b_s[:, None] * b_v[None, :]
            b_p = _softmax(tl.sum(b_q[:, None] * b_hk, axis=0), m_m)
            b_dp = tl.sum(b_hv * b_do[None, :], axis=1)
            b_dz = b_p * (b_dp - tl.sum(b_p * b_dp, axis=0))
            b_dq = tl.sum(b_hk * b_dz[None, :], axis=1) * scale
            tl.store(dq + token * K + o_k, b_dq.to(dq.dtype.element_ty), mask=m_k)
            tl.store(p + token * M + o_m, b_p, mask=m_m)
            tl.store(dz + token * M + o_m, b_dz, mask=m_m)
            if NEED_DG:
                b_y = (b_dz * tl.sum(b_q[:, None] * b_hkm, axis=0)
                       + b_p * tl.sum(b_hvm * b_do[None, :], axis=1))
                tl.store(y + token * M + o_m, b_y, mask=m_m)
        if NEED_DG:
            store_state(stk, i_row * NT + i_c, b_hkm, K, M, BK, BM, 0, 0, False)
            store_state(stv, i_row * NT + i_c, b_hvm, M, V, BM, BV, 0, 0, False)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_rev_kernel(q, k, v, s, g, do, p, dz, dhkt, dhvt, stk, stv, dk, dv, ds, dsm, bound, dhk0, dhv0,
                    chunk_offsets, scale, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    M: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                    BM: tl.constexpr, USE_DHKT: tl.constexpr, USE_DHVT: tl.constexpr,
                    STORE_DH0: tl.constexpr, NEED_DG: tl.constexpr, VARLEN: tl.constexpr):
    """Backward in time, one program per b*h. Writes dk, dv, ds in their dtypes; dhk0, dhv0
    float32 when STORE_DH0; with NEED_DG ds' [B, T, H, M] (zero on each chunk's last row) and
    boundary' [B, H, NT, M], float32 (see the module docstring)."""
    i_bh = tl.program_id(0).to(tl.int64)
    i_b, i_h, i_row, c_lo, c_hi = sequence_walk(chunk_offsets, i_bh, NT, H, VARLEN)
    o_k, o_m, o_v, m_k, m_m, m_v = _slot_blocks(0, K, V, M, BK, BV, BM)
    b_dhk, b_dhv = _initial_states(dhkt, dhvt, i_bh, 0, K, V, M, BK, BV, BM, USE_DHKT, USE_DHVT)
    for i in range(c_hi - c_lo):
        i_c = c_hi - 1 - i
        if NEED_DG:
            b_sk = load_state(stk, i_row * NT + i_c, K, M, BK, BM, 0, 0, False)
            b_sv = load_state(stv, i_row * NT + i_c, M, V, BM, BV, 0, 0, False)
            b_bound = tl.sum(b_sk * b_dhk, axis=0) + tl.sum(b_sv * b_dhv, axis=1)
            tl.store(bound + (i_row * NT + i_c) * M + o_m, b_bound, mask=m_m)
        n = tl.minimum(T - i_c * BT, BT)
        for j in range(n):
            # the chunk's rows from its last (j = 0) back to its first
            token = (i_b * T + i_c * BT + n - 1 - j) * H + i_h
            b_q, b_k, b_v, b_s, b_d = _token_inputs(q, k, v, s, g, token, scale, K, V, M, o_k, o_m,
                                                    o_v, m_k, m_m, m_v)
            b_do = tl.load(do + token * V + o_v, mask=m_v, other=0).to(tl.float32)
            b_p = tl.load(p + token * M + o_m, mask=m_m, other=0)
            b_dz = tl.load(dz + token * M + o_m, mask=m_m, other=0)
            # ds less this step's readouts, from the gradients carried in from step t + 1
            b_dsm = tl.sum(b_k[:, None] * b_dhk, axis=0) + tl.sum(b_dhv * b_v[None, :], axis=1)
            if NEED_DG:
                # the chunk's last row is left out (its own path into the leaving state is gate-free)
                tl.store(dsm + token * M + o_m, b_dsm * tl.where(j == 0, 0.0, 1.0), mask=m_m)
            b_ds = b_dsm + tl.sum(b_q * b_k, axis=0) * b_dz + tl.sum(b_v * b_do, axis=0) * b_p
            tl.store(ds + token * M + o_m, b_ds.to(ds.dtype.element_ty), mask=m_m)
            b_dhk += b_q[:, None] * b_dz[None, :]
            b_dhv += b_p[:, None] * b_do[None, :]
            tl.store(dk + token * K + o_k, tl.sum(b_dhk * b_s[None, :], axis=1).to(dk.dtype.element_ty),
                     mask=m_k)
            tl.store(dv + token * V + o_v, tl.sum(b_dhv * b_s[:, None], axis=0).to(dv.dtype.element_ty),
                     mask=m_v)
            b_dhk = b_dhk * b_d[None, :]
            b_dhv = b_dhv * b_d[:, None]
    if STORE_DH0:
        store_state(dhk0, i_bh, b_dhk, K, M, BK, BM, 0, 0, False)
        store_state(dhv0, i_bh, b_dhv, M, V, BM, BV, 0, 0, False)


def _pow2(n):
    return max(16, triton.next_power_of_2(n))


def _warps(BK, BM, BV):
    """8 warps for blocks of 8192 elements or more, and for 256-wide K or V blocks: with 4 (or
    2) warps Triton 3.6 aborts the process compiling `_bwd_fwd_kernel` at K = V = 256, M = 16
    (an LLVM SLPVectorizer assertion, on the H100)."""
    return 8 if max(BK * BM, BM * BV) >= 8192 or max(BK, BV) >= 256 else 4


class FusedRecurrentGSAFunction(torch.autograd.Function):
    """Autograd wrapper around the three token-by-token kernels and chunk_gate_grad. chunk_offsets:
    None, or those of a packed batch's sequences on its aligned row (B = 1, ops/common/varlen.py):
    initial and final states [N, ...]."""

    @staticmethod
    @compiles_ahead
    def forward(ctx, q, k, v, s, g, scale, hk0, hv0, output_final_state, chunk_offsets=None):
        q, k, v, s, g = (x.contiguous() for x in (q, k, v, s, g))
        h0 = None if hk0 is None else tuple(x.to(torch.float32).contiguous() for x in (hk0, hv0))
        B, T, H, K = q.shape
        V, M = v.shape[-1], s.shape[-1]
        N = state_count(B, chunk_offsets)
        BK, BM = _pow2(K), _pow2(M)
        BV = min(_pow2(V), 64)
        NV = triton.cdiv(V, BV)
        o = torch.empty(B, T, H, V, dtype=store_dtype(v.dtype), device=v.device)
        f32 = dict(dtype=torch.float32, device=q.device)
        hkt = torch.empty(N, H, K, M, **f32) if output_final_state else None
        hvt = torch.empty(N, H, M, V, **f32) if output_final_state else None
        launch(_fwd_kernel, flat_grid(NV, N * H),
            q, k, v, s, g, *(h0 or (None, None)), o, hkt, hvt, chunk_offsets, scale, T,
            triton.cdiv(T, CHUNK), H=H, K=K, V=V, M=M, BT=CHUNK, BK=BK, BV=BV, BM=BM,
            USE_H0=h0 is not None, STORE_HT=output_final_state, VARLEN=chunk_offsets is not None,
            num_warps=_warps(BK, BM, BV))
        ctx.save_for_backward(q, k, v, s, g, *(h0 or (None, None)))
        ctx.chunk_offsets = chunk_offsets
        ctx.scale = scale
        ctx.h0_dtypes = None if hk0 is None else (hk0.dtype, hv0.dtype)
        ctx.set_materialize_grads(False)
        return o.to(v.dtype), hkt, hvt

    @staticmethod
    @compiles_ahead
    def backward(ctx, do, dhkt, dhvt):
        q, k, v, s, g, hk0, hv0 = ctx.saved_tensors
        need_g, need_hk0, need_hv0 = (ctx.needs_input_grad[i] for i in (4, 6, 7))
        scale = ctx.scale
        B, T, H, K = q.shape
        V, M = v.shape[-1], s.shape[-1]
        N = state_count(B, ctx.chunk_offsets)
        varlen = dict(VARLEN=ctx.chunk_offsets is not None)
        BK, BM, BV = _pow2(K), _pow2(M), _pow2(V)
        num_warps = _warps(BK, BM, BV)
        NT = triton.cdiv(T, CHUNK)
        f32 = dict(dtype=torch.float32, device=q.device)
        do = torch.zeros_like(v) if do is None else do.contiguous()
        dhkt = None if dhkt is None else dhkt.to(torch.float32).contiguous()
        dhvt = None if dhvt is None else dhvt.to(torch.float32).contiguous()
        use_h0 = hk0 is not None
        need_h0 = use_h0 and (need_hk0 or need_hv0)

        dq = torch.empty(q.shape, dtype=store_dtype(q.dtype), device=q.device)
        p = torch.empty(B, T, H, M, **f32)
        dz = torch.empty_like(p)
        y = torch.empty_like(p) if need_g else p          # p: a never-written stand-in
        stk = torch.empty(B, H, NT, K, M, **f32) if need_g else None
        stv = torch.empty(B, H, NT, M, V, **f32) if need_g else None
        launch(_bwd_fwd_kernel, (N * H,),
            q, k, v, s, g, hk0, hv0, do, dq, p, dz, y, stk, stv, ctx.chunk_offsets, scale, T, NT,
            H=H, K=K, V=V, M=M, BT=CHUNK, BK=BK, BV=BV, BM=BM, USE_H0=use_h0, NEED_DG=need_g,
            num_warps=num_warps, **varlen)

        dk = torch.empty(k.shape, dtype=store_dtype(k.dtype), device=q.device)
        dv = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=q.device)
        ds = torch.empty(s.shape, dtype=store_dtype(s.dtype), device=q.device)
        dsm = torch.empty(B, T, H, M, **f32) if need_g else ds  # ds: a never-written stand-in
        bound = torch.empty(B, H, NT, M, **f32) if need_g else None
        dhk0 = torch.empty(N, H, K, M, **f32) if need_h0 else None
        dhv0 = torch.empty(N, H, M, V, **f32) if need_h0 else None
        launch(_bwd_rev_kernel, (N * H,),
            q, k, v, s, g, do, p, dz, dhkt, dhvt, stk, stv, dk, dv, ds, dsm, bound, dhk0, dhv0,
            ctx.chunk_offsets, scale, T, NT, H=H, K=K, V=V, M=M, BT=CHUNK, BK=BK, BV=BV, BM=BM,
            USE_DHKT=dhkt is not None, USE_DHVT=dhvt is not None, STORE_DH0=need_h0,
            NEED_DG=need_g, num_warps=num_warps, **varlen)
        dg = None
        if need_g:
            dg = chunk_gate_grad(y, torch.ones_like(y), s, dsm, bound, CHUNK, q_reads_current=True,
                                 out_dtype=store_dtype(g.dtype)).to(g.dtype)
        return gsa_grads(ctx, (q, k, v, s), (dq, dk, dv, ds), dg, (dhk0, dhv0), ctx.h0_dtypes)


def gsa_grads(ctx, inputs, grads, dg, dh0, h0_dtypes):
    """What a GSA Function's backward returns: the gradients of (q, k, v, s) in their inputs'
    dtypes, dg, and those of (hk0, hv0) in h0_dtypes (None without an initial state), each None
    where autograd needs none."""
    dq, dk, dv, ds = (x.to(t.dtype) for x, t in zip(grads, inputs))
    dhk0, dhv0 = (None, None) if h0_dtypes is None else (cast(x, d) for x, d in zip(dh0, h0_dtypes))
    return needed(ctx, dq, dk, dv, ds, dg, None, dhk0, dhv0, None, None)


def fused_recurrent_gsa(q, k, v, s, g=None, scale=None, initial_state=None, output_final_state=False,
                        cu_seqlens=None):
    """Gated slot attention, token by token.

    q, k: [B, T, H, K]; v: [B, T, H, V]; s, g: [B, T, H, M] (g the log gate, <= 0); one dtype
    (fp32, fp16 or bf16), but g may be float32 beside 16-bit inputs. g = None is the ungated
    form: s sets its own decay (`ops/gsa/gate.py`). initial_state: None or (hk [B, H, K, M],
    hv [B, H, M, V]) float32. scale defaults to K ** -0.5. Returns (o [B, T, H, V] in the
    inputs' dtype, (hk, hv) float32 or None); differentiable in every tensor. cu_seqlens: None,
    or int32 / int64 [N + 1], the cumulative starts of N sequences packed along T (B = 1), each
    run on its own: initial and final states ([N, H, K, M], [N, H, M, V]).
    """
    return apply_gsa("fused_recurrent_gsa", FusedRecurrentGSAFunction, q, k, v, s, g, scale,
                     initial_state, output_final_state, cu_seqlens, CHUNK)


def apply_gsa(op, function, q, k, v, s, g, scale, initial_state, output_final_state,
              cu_seqlens=None, chunk_size=None):
    """The public functions' shared body: check the arguments (ValueError before any launch), turn
    s into (s', g) where g is None (`additive_gate`, per packed sequence), run the autograd
    `function` (its last argument the chunk offsets of a packed batch on its aligned row of
    chunks of chunk_size, `apply_packed`), return (o, (hk, hv) or None)."""
    sizes = check_inputs(op, dict(q=q, k=k, v=v, s=s, g=g),
                         dict(q="BTHK", k="BTHK", v="BTHV", s="BTHM", g="BTHM"), optional=("g",),
                         initial_state=initial_state, states=dict(hk="BHKM", hv="BHMV"),
                         cu_seqlens=cu_seqlens)
    scale = sizes["K"] ** -0.5 if scale is None else float(scale)
    if g is None:
        s, g = additive_gate(s, sizes.get("cu_seqlens"))
    hk0, hv0 = (None, None) if initial_state is None else initial_state
    o, hkt, hvt = apply_packed(function, Packing.of(sizes, chunk_size, q.device), (q, k, v, s, g),
                               (True,) * 5, scale, hk0, hv0, bool(output_final_state))
    return o, ((hkt, hvt) if output_final_state else None)
