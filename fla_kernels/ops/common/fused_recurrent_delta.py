"""Token-by-token kernels of the delta-rule family: delta_rule, gated_delta_rule and kda.

Per (batch, head), with H_t = D_t S_{t-1} the decayed state:
    r_t = v_t - k_t H_t,   u_t = beta_t r_t,   S_t = H_t + k_t^T u_t,   o_t = scale q_t S_t
D_t is 1 (GATE_NONE), exp(g_t) with g [B, T, H] (GATE_SCALAR) or diag(exp(g_t)) with
g [B, T, H, K] (GATE_CHANNEL). The update acts on the K side only, so each column of V evolves
alone: every kernel runs one program per (V-block, batch * head) and keeps a [BK, BV] float32
block of the state (or of its gradient) in registers, all of K in one block.
- `_fwd_kernel` steps forward: o, the final state, and the residuals r [B, T, H, V] float32 that
  the backward reads in place of inverting the update (which would divide by the decay).
- `_bwd_dkv_kernel` steps backward with dS = dL/dS_t: du_t = k_t dS_t (stored), dv = beta du,
  dbeta = du . r, the write part of dk, dk_w = dS_t u_t, and dh0; with dg, the gradient
  reaching each chunk's leaving state from later chunks.
- `_bwd_dq_kernel` steps forward again from h0: dq = scale S_t do_t and the read part of dk,
  dk_r = -beta_t H_t du_t, added to dk_w in place; with dg, dq' and the chunk boundary terms.
Sums over V are per V-block partials reduced by torch. A packed batch (cu_seqlens) runs on its
chunk-aligned row (ops/common/varlen.py), as ops/common/fused_recurrent.py does.

The gate gradient. With G the chunk-local cumulative log gate, the loss depends on a chunk's
gates only through q_s exp(G_s) (the read of S_s), k_s exp(G_s) (the read of H_s by k_s),
k_s exp(-G_s) (the write k_s^T u_s) and the state leaving the chunk. So for t in a chunk with
last row L, per key channel,
    dg_t = sum_V(S_L * dX_L) + sum_{t <= s <= L} (q_s dq_s + k_s dk_r_s - k_s dk_w_s)
with dX_L the gradient reaching S_L from later chunks (dht after the last token). The token's own
k_s^T u_s read by q_s appears in q_s dq_s and in k_s dk_w_s, and the last row's k_L^T u_L in the
boundary and in k_L dk_w_L: they carry no gate and cancel only in exact arithmetic, so the kernels
leave them out of both sides (as ops/common/fused_recurrent.py does):
    dq'_s = scale H_s do_s,   dk_w'_s = dX_s u_s for s < L and 0 for s = L,   bound' = sum_V(H_L * dX_L)
    dg_t = bound' + sum_{t <= s <= L} q_s dq'_s - sum_{t <= s <= L} k_s (dk_w'_s - dk_r_s)
(dX_s = dS_s less scale q_s^T do_s), summed inside chunks by `chunk_gate_grad`. The scalar
gate's gradient is that per-channel one summed over K.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.autograd import needed, save_context, upstream
from fla_kernels.ops.common.fused_recurrent import GATE_CHANNEL, gate_mode, token_program, token_row
from fla_kernels.ops.common.gate_grad import chunk_gate_grad
from fla_kernels.ops.common.launch import compiles_ahead, flat_grid, launch
from fla_kernels.ops.common.partials import sum_parts
from fla_kernels.ops.common.tiles import initial_block, load_state, store_state
from fla_kernels.ops.common.varlen import Packing, apply_packed, state_count
from fla_kernels.precision import store_dtype

CHUNK = 64  # tokens per chunk of the gate-gradient sums


@triton.jit
def _decay(g, token, K: tl.constexpr, o_k, m_k, GATE: tl.constexpr):
    """exp(g_t) shaped to scale a [BK, BV] block: [BK, 1] (per channel) or a scalar; 1 without a gate."""
    if GATE == 2:
        return tl.exp(tl.load(g + token * K + o_k, mask=m_k, other=0).to(tl.float32))[:, None]
    elif GATE == 1:
        return tl.exp(tl.load(g + token).to(tl.float32))
    else:
        return 1.0


@triton.jit(do_not_specialize=["T", "NT"])
def _fwd_kernel(q, k, v, beta, g, h0, o, ht, res, chunk_offsets, scale, T, NT, H: tl.constexpr,
                K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, GATE: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
                STORE_RES: tl.constexpr, VARLEN: tl.constexpr):
    """o [B, T, H, V] in o's dtype; ht [N, H, K, V] float32 when STORE_HT; the residuals
    r [B, T, H, V] float32 when STORE_RES."""
    i_v, i_bh, i_b, i_h, i_row, c_lo, c_hi, o_k, o_v, m_k, m_v = token_program(
        chunk_offsets, NT, H, K, V, BK, BV, VARLEN)
    b_h = initial_block(h0, i_bh, K, V, BK, BV, 0, i_v, USE_H0, False)
    for t in range(c_lo * BT, tl.minimum(c_hi * BT, T)):
        token = (i_b * T + t) * H + i_h
        b_q = token_row(q, token, K, o_k, m_k) * scale
        b_k = token_row(k, token, K, o_k, m_k)
        b_v = token_row(v, token, V, o_v, m_v)
        b_beta = tl.load(beta + token).to(tl.float32)
        b_h = b_h * _decay(g, token, K, o_k, m_k, GATE)
        b_r = b_v - tl.sum(b_k[:, None] * b_h, axis=0)
        b_h += b_k[:, None] * (b_beta * b_r)[None, :]
        b_o = tl.sum(b_q[:, None] * b_h, axis=0)
        tl.store(o + token * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
        if STORE_RES:
            tl.store(res + token * V + o_v, b_r, mask=m_v)
    if STORE_HT:
        store_state(ht, i_bh, b_h, K, V, BK, BV, 0, i_v, False)


@triton.jit(do_not_specialize=["T", "NT", "B"])
def _bwd_dkv_kernel(q, k, beta, g, res, do, dht, du, dk, dks, dv, dbeta, dh0, exits, chunk_offsets,
                    scale, T, NT, B, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr,
                    USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, NEED_DG: tl.constexpr,
                    VARLEN: tl.constexpr):
    """Backward in time. du [B, T, H, V] float32; per V-block partials (float32) of dk_w (into
    dk) and, when NEED_DG, dk_w' (into dks) [NV, B, T, H, K], and of dbeta [NV, B, T, H]; dv in
    dv's dtype; dh0 [N, H, K, V] float32 when STORE_DH0; when NEED_DG, exits [B, H, NT, K, V]
    float32: the gradient reaching each chunk's leaving state from later chunks.

    b_dx carries dX_t, the gradient reaching S_t from later tokens (dht after the last)."""
    i_v, i_bh, i_b, i_h, i_row, c_lo, c_hi, o_k, o_v, m_k, m_v = token_program(
        chunk_offsets, NT, H, K, V, BK, BV, VARLEN)
    b_dx = initial_block(dht, i_bh, K, V, BK, BV, 0, i_v, USE_DHT, False)
    for i in range(c_hi - c_lo):
        i_c = c_hi - 1 - i
        if NEED_DG:
            store_state(exits, i_row * NT + i_c, b_dx, K, V, BK, BV, 0, i_v, False)
        n = tl.minimum(T - i_c * BT, BT)
        for j in range(n):
            # the chunk's rows from its last (j = 0) back to its first
            token = (i_b * T + i_c * BT + n - 1 - j) * H + i_h
            b_q = token_row(q, token, K, o_k, m_k) * scale
            b_k = token_row(k, token, K, o_k, m_k)
            b_do = token_row(do, token, V, o_v, m_v)
            b_r = token_row(res, token, V, o_v, m_v)
            b_beta = tl.load(beta + token).to(tl.float32)
            b_u = b_beta * b_r
            b_dS = b_dx + b_q[:, None] * b_do[None, :]
            b_du = tl.sum(b_k[:, None] * b_dS, axis=0)
            part = (i_v * B * T * H + token) * K + o_k
            tl.store(du + token * V + o_v, b_du, mask=m_v)
            tl.store(dv + token * V + o_v, (b_beta * b_du).to(dv.dtype.element_ty), mask=m_v)
            tl.store(dbeta + i_v * B * T * H + token, tl.sum(b_du * b_r, axis=0))
            tl.store(dk + part, tl.sum(b_dS * b_u[None, :], axis=1), mask=m_k)
            if NEED_DG:
                # the chunk's last row keeps no dk_w': its path into the leaving state is left
                # out of the boundary term as well
                b_dks = tl.sum(b_dx * b_u[None, :], axis=1)
                tl.store(dks + part, tl.where(j > 0, b_dks, 0.0), mask=m_k)
            b_dH = b_dS - b_k[:, None] * (b_beta * b_du)[None, :]
            b_dx = b_dH * _decay(g, token, K, o_k, m_k, GATE)
    if STORE_DH0:
        store_state(dh0, i_bh, b_dx, K, V, BK, BV, 0, i_v, False)


@triton.jit(do_not_specialize=["T", "NT", "B"])
def _bwd_dq_kernel(k, beta, g, h0, res, do, du, dq, dqs, dk, dks, exits, bound, chunk_offsets, scale,
                   T, NT, B, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr, USE_H0: tl.constexpr,
                   NEED_DG: tl.constexpr, VARLEN: tl.constexpr):
    """Forward in time, after `_bwd_dkv_kernel`. Per V-block partials [NV, B, T, H, K] float32
    of dq and, when NEED_DG, dq'; dk_r added to dk (and subtracted from dks when NEED_DG) in
    place; when NEED_DG, bound' [NV, B, H, NT, K] float32."""
    i_v, i_bh, i_b, i_h, i_row, c_lo, c_hi, o_k, o_v, m_k, m_v = token_program(
        chunk_offsets, NT, H, K, V, BK, BV, VARLEN)
    b_h = initial_block(h0, i_bh, K, V, BK, BV, 0, i_v, USE_H0, False)
    for i_c in range(c_lo, c_hi):
        n = tl.minimum(T - i_c * BT, BT)
        for j in range(n):
            token = (i_b * T + i_c * BT + j) * H + i_h
            b_k = token_row(k, token, K, o_k, m_k)
            b_do = token_row(do, token, V, o_v, m_v) * scale
            b_r = token_row(res, token, V, o_v, m_v)
            b_du = token_row(du, token, V, o_v, m_v)
            b_beta = tl.load(beta + token).to(tl.float32)
            b_H = b_h * _decay(g, token, K, o_k, m_k, GATE)
            b_dkr = -b_beta * tl.sum(b_H * b_du[None, :], axis=1)
            b_h = b_H + b_k[:, None] * (b_beta * b_r)[None, :]
            part = (i_v * B * T * H + token) * K + o_k
            tl.store(dq + part, tl.sum(b_h * b_do[None, :], axis=1), mask=m_k)
            tl.store(dk + part, tl.load(dk + part, mask=m_k, other=0) + b_dkr, mask=m_k)
            if NEED_DG:
                tl.store(dqs + part, tl.sum(b_H * b_do[None, :], axis=1), mask=m_k)
                tl.store(dks + part, tl.load(dks + part, mask=m_k, other=0) - b_dkr, mask=m_k)
                if j == n - 1:
                    b_x = load_state(exits, i_row * NT + i_c, K, V, BK, BV, 0, i_v, False)
                    tl.store(bound + ((i_v * B * H + i_row) * NT + i_c) * K + o_k,
                             tl.sum(b_H * b_x, axis=1), mask=m_k)


def _blocks(K, V):
    """(BK, BV, NV, num_warps): all of K in one block, V split in blocks of at most 32."""
    BK = triton.next_power_of_2(K)
    BV = min(triton.next_power_of_2(V), 32)
    return BK, BV, triton.cdiv(V, BV), (8 if BK * BV >= 8192 else 4)


class FusedRecurrentDeltaFunction(torch.autograd.Function):
    """Autograd wrapper around the three token-by-token kernels and chunk_gate_grad.

    g: None (delta_rule; its gradient is None), [B, T, H] (gated_delta_rule) or [B, T, H, K]
    (kda). chunk_offsets: None, or those of a packed batch's sequences on its aligned row (B = 1,
    ops/common/varlen.py): initial and final state [N, H, K, V].
    """

    @staticmethod
    def parts_per_row(tensors) -> int:
        """The backward's float32 buffers per batch entry (ops/common/batch_groups.py): dq, dk, dq'
        and dk' and dbeta, NV of each, du, and the chunks' exit states."""
        q, v = tensors[0], tensors[2]
        _, T, H, K = q.shape
        V = v.shape[-1]
        NV = _blocks(K, V)[2]
        return NV * T * H * (4 * K + 1) + T * H * V + triton.cdiv(T, CHUNK) * H * K * V

    @staticmethod
    @compiles_ahead
    def forward(ctx, q, k, v, beta, g, scale, initial_state, output_final_state, chunk_offsets=None):
        q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
        g = None if g is None else g.contiguous()
        h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
        B, T, H, K = q.shape
        V = v.shape[-1]
        N = state_count(B, chunk_offsets)
        BK, BV, NV, num_warps = _blocks(K, V)
        grads = any(ctx.needs_input_grad[:7])
        o = torch.empty(B, T, H, V, dtype=store_dtype(v.dtype), device=v.device)
        ht = torch.empty(N, H, K, V, dtype=torch.float32, device=v.device) if output_final_state else None
        res = torch.empty(B, T, H, V, dtype=torch.float32, device=v.device) if grads else None
        launch(_fwd_kernel, flat_grid(NV, N * H), q, k, v, beta, g, h0, o, ht, res, chunk_offsets, scale,
               T, triton.cdiv(T, CHUNK), H=H, K=K, V=V, BT=CHUNK, BK=BK, BV=BV, GATE=gate_mode(g),
               USE_H0=h0 is not None, STORE_HT=output_final_state, STORE_RES=grads,
               VARLEN=chunk_offsets is not None, num_warps=num_warps)
        save_context(ctx, scale, output_final_state, q, k, v, beta, g, h0, res,
                     chunk_offsets=chunk_offsets, initial_state=initial_state)
        ctx.set_materialize_grads(False)
        return o.to(v.dtype), ht

    @staticmethod
    @compiles_ahead
    def backward(ctx, do, dht):
        q, k, v, beta, g, h0, res = ctx.saved_tensors
        need_g = ctx.needs_input_grad[4] and g is not None
        need_h0 = ctx.needs_input_grad[6] and h0 is not None
        gate = gate_mode(g)
        B, T, H, K = q.shape
        V = v.shape[-1]
        N = state_count(B, ctx.chunk_offsets)
        BK, BV, NV, num_warps = _blocks(K, V)
        NT = triton.cdiv(T, CHUNK)
        f32 = dict(dtype=torch.float32, device=q.device)
        modes = dict(H=H, K=K, V=V, BT=CHUNK, BK=BK, BV=BV, GATE=gate, NEED_DG=need_g,
                     VARLEN=ctx.chunk_offsets is not None, num_warps=num_warps)
        do, dht = upstream(ctx, v, do, dht)
        grid = flat_grid(NV, N * H)

        du = torch.empty(B, T, H, V, **f32)
        dk = torch.empty(NV, B, T, H, K, **f32)
        dks = torch.empty(NV, B, T, H, K, **f32) if need_g else dk   # dk: a never-written stand-in
        dv = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=v.device)
        dbeta = torch.empty(NV, B, T, H, **f32)
        dh0 = torch.empty(N, H, K, V, **f32) if need_h0 else None
        exits = torch.empty(B, H, NT, K, V, **f32) if need_g else None
        launch(_bwd_dkv_kernel, grid, q, k, beta, g, res, do, dht, du, dk, dks, dv, dbeta, dh0, exits,
               ctx.chunk_offsets, ctx.scale, T, NT, B, USE_DHT=dht is not None, STORE_DH0=need_h0, **modes)

        dq = torch.empty(NV, B, T, H, K, **f32)
        dqs = torch.empty(NV, B, T, H, K, **f32) if need_g else dq   # dq: a never-written stand-in
        bound = torch.empty(NV, B, H, NT, K, **f32) if need_g else None
        launch(_bwd_dq_kernel, grid, k, beta, g, h0, res, do, du, dq, dqs, dk, dks, exits, bound,
               ctx.chunk_offsets, ctx.scale, T, NT, B, USE_H0=h0 is not None, **modes)

        dg = None
        if need_g:
            per_channel = gate == GATE_CHANNEL
            dg = chunk_gate_grad(q, sum_parts(dqs, torch.float32), k, sum_parts(dks, torch.float32),
                                 bound.sum(0), CHUNK, q_reads_current=True,
                                 out_dtype=store_dtype(g.dtype) if per_channel else torch.float32)
            dg = (dg if per_channel else dg.sum(-1)).to(g.dtype)
        return needed(
            ctx,
            sum_parts(dq, q.dtype),
            sum_parts(dk, k.dtype),
            dv.to(v.dtype),
            sum_parts(dbeta, beta.dtype),
            dg,
            None,
            dh0.to(ctx.h0_dtype) if need_h0 else None,
            None,
            None,
        )


def fused_recurrent_delta(q, k, v, beta, g, scale, initial_state, output_final_state, cu_seqlens=None):
    """The shared launcher; the public functions check their arguments and call this.

    g: None, [B, T, H] or [B, T, H, K] (`gate_mode`). cu_seqlens: None, or a packed batch's
    checked sequence starts (host ints, `check_inputs`'s sizes["cu_seqlens"]), run on its
    aligned row (ops/common/varlen.py).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    packing = None if cu_seqlens is None else Packing(cu_seqlens, CHUNK, q.device)
    return apply_packed(FusedRecurrentDeltaFunction, packing, (q, k, v, beta, g), (True,) * 5,
                        scale, initial_state, bool(output_final_state))

