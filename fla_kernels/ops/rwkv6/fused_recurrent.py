"""RWKV6, token by token: forward and backward Triton kernels with the state in registers.

Per (batch, head), with state S of shape [K, V]:
    o_t = scale * r_t (S_{t-1} + diag(u) k_t^T v_t)
    S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t

Every kernel runs one program per (V-block, batch * head) and keeps a [BK, BV]
float32 block of the state (or of its gradient) in registers:
- `_fwd_kernel` steps forward in time: o and the final state.
- `_bwd_dr_kernel` steps forward again: dr and, when dw is needed, drs' (below)
  and the state leaving every chunk of `CHUNK` tokens less its last k^T v.
- `_bwd_dkv_kernel` steps backward with dS: dk, dv, du, dh0 and, when dw is
  needed, dks' and the boundary term of each chunk.
dw then comes from `chunk_gate_grad`, which sums inside a chunk only, so its
error does not grow with T and no past state is ever rebuilt by dividing by a
decay. Sums over V are split across V-blocks and reduced with torch afterwards.

dw without the gate-free terms. dL/dw_t = sum_v (exp(w_t) S_{t-1}) * dS_t, and
with x_t = sum_v S_t * dS_t the recurrences for S and for
dS_{t-1} = exp(w_t) dS_t + scale r_t^T do_t give, summed inside the chunk (last row L),
    dw_t = sum_v(S_L * dS_L) + sum_{s > t} r_s drs_s - sum_{s >= t} k_s dks_s
with drs_s = scale S_{s-1} do_s and dks_s = dS_s v_s. Both sums carry terms
with no gate in them, which cancel exactly only in exact arithmetic:
r_s drs_s holds scale (r_s * k_{s-1}) (v_{s-1} . do_s) and k_{s-1} dks_{s-1}
the same, and sum_v(S_L * dS_L) holds k_L (dS_L v_L) = k_L dks_L. Under
strong decay they are O(1) while dw is tiny, so in float32 they would cost dw
its precision (at T = 1 with no initial state dw is exactly 0). The kernels
therefore hand chunk_gate_grad the same sums with those terms left out of
both sides:
    drs'_s = scale (exp(w_{s-1}) S_{s-2}) do_s          (S_{s-1} less k_{s-1}^T v_{s-1})
    dks'_s = (exp(w_{s+1}) dS_{s+1}) v_s for s < L,   dks'_L = 0   (dS_s less scale r_{s+1}^T do_{s+1})
    boundary' = sum_v (exp(w_L) S_{L-1}) * dS_L        (S_L less k_L^T v_L)
    dw_t = boundary' + sum_{t < s <= L} r_s drs'_s - sum_{t <= s < L} k_s dks'_s
which is exactly dw (drs' of a chunk's first row is never read). Every term
left carries at least one gate factor.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common import chunk_gate_grad
from fla_kernels.utils import check_inputs, store_dtype

CHUNK = 64  # tokens per chunk of the dw sums


@triton.jit(do_not_specialize=["T"])
def _fwd_kernel(r, k, v, w, u, h0, o, ht, scale, T, H: tl.constexpr, K: tl.constexpr,
                V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                USE_H0: tl.constexpr, STORE_HT: tl.constexpr):
    """o [B, T, H, V] in o's dtype; ht [B, H, K, V] float32 when STORE_HT."""
    i_v, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = i_bh * K * V + o_k[:, None] * V + o_v[None, :]

    p_r = r + (i_b * T * H + i_h) * K + o_k
    p_k = k + (i_b * T * H + i_h) * K + o_k
    p_w = w + (i_b * T * H + i_h) * K + o_k
    p_v = v + (i_b * T * H + i_h) * V + o_v
    p_o = o + (i_b * T * H + i_h) * V + o_v
    b_u = tl.load(u + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + o_kv, mask=m_kv, other=0).to(tl.float32)
    for _ in range(T):
        b_r = tl.load(p_r, mask=m_k, other=0).to(tl.float32) * scale
        b_k = tl.load(p_k, mask=m_k, other=0).to(tl.float32)
        b_w = tl.load(p_w, mask=m_k, other=0).to(tl.float32)
        b_v = tl.load(p_v, mask=m_v, other=0).to(tl.float32)
        b_kv = b_k[:, None] * b_v[None, :]
        b_o = tl.sum(b_r[:, None] * (b_h + b_u[:, None] * b_kv), axis=0)
        tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=m_v)
        b_h = tl.exp(b_w)[:, None] * b_h + b_kv
        p_r += H * K
        p_k += H * K
        p_w += H * K
        p_v += H * V
        p_o += H * V
    if STORE_HT:
        tl.store(ht + o_kv, b_h, mask=m_kv)


@triton.jit(do_not_specialize=["T", "NT", "B"])
def _bwd_dr_kernel(k, v, w, u, h0, do, dr, drs, states, scale, T, NT, B,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, USE_H0: tl.constexpr, NEED_DW: tl.constexpr):
    """Forward in time. Per V-block partials [NV, B, T, H, K] float32 of dr (full) and
    drs' (through the state before its last k^T v, see the module docstring; garbage in a
    chunk's first row, which is never read); states [B, H, NT, K, V] float32: the state
    leaving each chunk less the chunk's last k^T v, i.e. exp(w_L) S_{L-1} (each program
    writes its V columns). drs and states are written only when NEED_DW."""
    i_v, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]

    p_k = k + (i_b * T * H + i_h) * K + o_k
    p_w = w + (i_b * T * H + i_h) * K + o_k
    p_v = v + (i_b * T * H + i_h) * V + o_v
    p_do = do + (i_b * T * H + i_h) * V + o_v
    p_dr = dr + ((i_v * B + i_b) * T * H + i_h) * K + o_k
    p_drs = drs + ((i_v * B + i_b) * T * H + i_h) * K + o_k
    b_u = tl.load(u + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_h = tl.zeros([BK, BV], dtype=tl.float32)  # S_{t-1}
    if USE_H0:
        b_h += tl.load(h0 + i_bh * K * V + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0)
    b_hd = b_h  # exp(w_{t-1}) S_{t-2}: S_{t-1} less k_{t-1}^T v_{t-1} (a stand-in at t = 0)
    for i_c in range(NT):
        for _ in range(tl.minimum(T - i_c * BT, BT)):
            b_k = tl.load(p_k, mask=m_k, other=0).to(tl.float32)
            b_w = tl.load(p_w, mask=m_k, other=0).to(tl.float32)
            b_v = tl.load(p_v, mask=m_v, other=0).to(tl.float32)
            b_do = tl.load(p_do, mask=m_v, other=0).to(tl.float32) * scale
            b_dr = tl.sum(b_h * b_do[None, :], axis=1) + b_u * b_k * tl.sum(b_v * b_do, axis=0)
            tl.store(p_dr, b_dr, mask=m_k)
            if NEED_DW:
                tl.store(p_drs, tl.sum(b_hd * b_do[None, :], axis=1), mask=m_k)
            b_hd = tl.exp(b_w)[:, None] * b_h
            b_h = b_hd + b_k[:, None] * b_v[None, :]
            p_k += H * K
            p_w += H * K
            p_v += H * V
            p_do += H * V
            p_dr += H * K
            p_drs += H * K
        if NEED_DW:
            p_s = states + (i_bh * NT + i_c) * K * V + o_k[:, None] * V + o_v[None, :]
            tl.store(p_s, b_hd, mask=m_kv)


@triton.jit(do_not_specialize=["T", "NT", "B"])
def _bwd_dkv_kernel(r, k, v, w, u, do, dht, states, dk, dks, dv, du, dh0, bound, scale, T, NT, B,
                    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                    BK: tl.constexpr, BV: tl.constexpr, USE_DHT: tl.constexpr,
                    STORE_DH0: tl.constexpr, NEED_DW: tl.constexpr):
    """Backward in time with dS = dL/dS_t. Per V-block partials (float32): dk, dks'
    [NV, B, T, H, K], du per chunk [NV, B, H, NT, K] (summed by torch, pairwise: a serial
    fp32 sum over a long sequence loses ~sqrt(T) ulps), boundary' [NV, B, H, NT, K] (dks' and boundary':
    see the module docstring; written only when NEED_DW); dv in dv's dtype;
    dh0 [B, H, K, V] float32 when STORE_DH0."""
    i_v, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]

    last = (i_b * T + T - 1) * H + i_h  # the last token of this sequence
    p_r = r + last * K + o_k
    p_k = k + last * K + o_k
    p_w = w + last * K + o_k
    p_v = v + last * V + o_v
    p_do = do + last * V + o_v
    p_dv = dv + last * V + o_v
    p_dk = dk + (i_v * B * T * H + last) * K + o_k
    p_dks = dks + (i_v * B * T * H + last) * K + o_k
    b_u = tl.load(u + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        b_dh += tl.load(dht + i_bh * K * V + o_kv, mask=m_kv, other=0).to(tl.float32)
    for i in range(NT):
        i_c = NT - 1 - i
        if NEED_DW:
            b_s = tl.load(states + (i_bh * NT + i_c) * K * V + o_kv, mask=m_kv, other=0)
            tl.store(bound + ((i_v * B * H + i_bh) * NT + i_c) * K + o_k,
                     tl.sum(b_s * b_dh, axis=1), mask=m_k)
        # exp(w_{t+1}) dS_{t+1}: dS_t less scale r_{t+1}^T do_{t+1}; zero for the chunk's last row,
        # whose own path into the leaving state is left out of the boundary term as well
        b_dhd = tl.zeros([BK, BV], dtype=tl.float32)
        b_duc = tl.zeros([BK], dtype=tl.float32)
        for _ in range(tl.minimum(T - i_c * BT, BT)):
            b_r = tl.load(p_r, mask=m_k, other=0).to(tl.float32) * scale
            b_k = tl.load(p_k, mask=m_k, other=0).to(tl.float32)
            b_w = tl.load(p_w, mask=m_k, other=0).to(tl.float32)
            b_v = tl.load(p_v, mask=m_v, other=0).to(tl.float32)
            b_do = tl.load(p_do, mask=m_v, other=0).to(tl.float32)
            b_vdo = tl.sum(b_v * b_do, axis=0)
            tl.store(p_dk, tl.sum(b_dh * b_v[None, :], axis=1) + b_r * b_u * b_vdo, mask=m_k)
            if NEED_DW:
                tl.store(p_dks, tl.sum(b_dhd * b_v[None, :], axis=1), mask=m_k)
            b_dv = tl.sum(b_dh * b_k[:, None], axis=0) + tl.sum(b_r * b_u * b_k, axis=0) * b_do
            tl.store(p_dv, b_dv.to(p_dv.dtype.element_ty), mask=m_v)
            b_duc += b_r * b_k * b_vdo
            b_dhd = tl.exp(b_w)[:, None] * b_dh
            b_dh = b_dhd + b_r[:, None] * b_do[None, :]
            p_r -= H * K
            p_k -= H * K
            p_w -= H * K
            p_v -= H * V
            p_do -= H * V
            p_dv -= H * V
            p_dk -= H * K
            p_dks -= H * K
        tl.store(du + ((i_v * B * H + i_bh) * NT + i_c) * K + o_k, b_duc, mask=m_k)
    if STORE_DH0:
        tl.store(dh0 + i_bh * K * V + o_kv, b_dh, mask=m_kv)


def _blocks(K, V):
    """(BK, BV, NV, num_warps): all of K in one block, V split in blocks of at most 32."""
    BK = triton.next_power_of_2(K)
    BV = min(triton.next_power_of_2(V), 32)
    return BK, BV, triton.cdiv(V, BV), (8 if BK * BV >= 8192 else 4)


class FusedRecurrentRWKV6Function(torch.autograd.Function):
    """Autograd wrapper around the three token-by-token kernels and chunk_gate_grad."""

    @staticmethod
    def forward(ctx, r, k, v, w, u, scale, initial_state, output_final_state):
        r, k, v, w, u = (x.contiguous() for x in (r, k, v, w, u))
        h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
        B, T, H, K = r.shape
        V = v.shape[-1]
        BK, BV, NV, num_warps = _blocks(K, V)
        o = torch.empty(B, T, H, V, dtype=store_dtype(v.dtype), device=v.device)
        ht = torch.empty(B, H, K, V, dtype=torch.float32, device=v.device) if output_final_state else None
        _fwd_kernel[(NV, B * H)](
            r, k, v, w, u, h0, o, ht, scale, T, H=H, K=K, V=V, BK=BK, BV=BV,
            USE_H0=h0 is not None, STORE_HT=output_final_state, num_warps=num_warps)
        ctx.save_for_backward(r, k, v, w, u, h0)
        ctx.scale = scale
        ctx.h0_dtype = None if initial_state is None else initial_state.dtype
        ctx.set_materialize_grads(False)
        return o.to(v.dtype), ht

    @staticmethod
    def backward(ctx, do, dht):
        r, k, v, w, u, h0 = ctx.saved_tensors
        need_r, need_k, need_v, need_w, need_u, _, need_h0, _ = ctx.needs_input_grad
        scale = ctx.scale
        B, T, H, K = r.shape
        V = v.shape[-1]
        BK, BV, NV, num_warps = _blocks(K, V)
        NT = triton.cdiv(T, CHUNK)
        f32 = dict(dtype=torch.float32, device=r.device)
        do = torch.zeros_like(v) if do is None else do.contiguous()
        dht = None if dht is None else dht.to(torch.float32).contiguous()
        dr = drs = dk = dks = dv = du = dh0 = dw = None

        states = torch.empty(B, H, NT, K, V, **f32) if need_w else None
        if need_r or need_w:
            dr = torch.empty(NV, B, T, H, K, **f32)
            drs = torch.empty(NV, B, T, H, K, **f32) if need_w else dr  # dr: a never-written stand-in
            _bwd_dr_kernel[(NV, B * H)](
                k, v, w, u, h0, do, dr, drs, states, scale, T, NT, B, H=H, K=K, V=V, BT=CHUNK,
                BK=BK, BV=BV, USE_H0=h0 is not None, NEED_DW=need_w, num_warps=num_warps)
        if need_k or need_v or need_w or need_u or need_h0:
            dk = torch.empty(NV, B, T, H, K, **f32)
            dks = torch.empty(NV, B, T, H, K, **f32) if need_w else dk  # dk: a never-written stand-in
            dv = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=v.device)
            du = torch.empty(NV, B, H, NT, K, **f32)
            dh0 = torch.empty(B, H, K, V, **f32) if need_h0 else None
            bound = torch.empty(NV, B, H, NT, K, **f32) if need_w else None
            _bwd_dkv_kernel[(NV, B * H)](
                r, k, v, w, u, do, dht, states, dk, dks, dv, du, dh0, bound, scale, T, NT, B,
                H=H, K=K, V=V, BT=CHUNK, BK=BK, BV=BV, USE_DHT=dht is not None,
                STORE_DH0=need_h0, NEED_DW=need_w, num_warps=num_warps)
            if need_w:
                dw = chunk_gate_grad(r, drs.sum(0), k, dks.sum(0), bound.sum(0), CHUNK,
                                     q_reads_current=False, out_dtype=store_dtype(w.dtype)).to(w.dtype)
        return (
            dr.sum(0).to(r.dtype) if need_r else None,
            dk.sum(0).to(k.dtype) if need_k else None,
            dv.to(v.dtype) if need_v else None,
            dw,
            du.sum((0, 1, 3)).to(u.dtype) if need_u else None,
            None,
            dh0.to(ctx.h0_dtype) if need_h0 else None,
            None,
        )


def fused_recurrent_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False):
    """RWKV6 attention, token by token.

    r, k, w: [B, T, H, K]; v: [B, T, H, V]; u: [H, K]; one dtype (fp32, fp16 or
    bf16); w is the log decay (<= 0). initial_state: [B, H, K, V] float32 or None.
    scale defaults to K ** -0.5. Returns (o [B, T, H, V] in the inputs' dtype,
    final state [B, H, K, V] float32 or None); differentiable in every tensor.
    """
    if not all(isinstance(x, torch.Tensor) and x.dim() == n
               for x, n in ((r, 4), (k, 4), (v, 4), (w, 4), (u, 2))):
        raise ValueError("fused_recurrent_rwkv6: r, k, v, w must be 4-D [B, T, H, *] tensors "
                         "and u a 2-D [H, K] tensor.")
    B, T, H, K = r.shape
    V = v.shape[-1]
    check_inputs("fused_recurrent_rwkv6",
                 {"r": r, "k": k, "v": v, "w": w, "u": u},
                 {"r": (B, T, H, K), "k": (B, T, H, K), "v": (B, T, H, V), "w": (B, T, H, K),
                  "u": (H, K)},
                 initial_state=initial_state, state_shape=(B, H, K, V))
    scale = K ** -0.5 if scale is None else float(scale)
    return FusedRecurrentRWKV6Function.apply(r, k, v, w, u, scale, initial_state,
                                             bool(output_final_state))
