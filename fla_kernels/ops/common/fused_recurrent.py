"""Token-by-token kernels for S_t = decay_t S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.

One kernel set serves four op families through the constexprs GATE and READS_PREVIOUS:
    GATE_CHANNEL (gla):        decay_t = diag(exp(g_t)), g [B, T, H, K]
    GATE_SCALAR  (simple_gla): decay_t = exp(g_t),       g [B, T, H]
    GATE_NONE    (linear_attn, simple_gla with g=None): decay_t = 1
    GATE_CHANNEL with READS_PREVIOUS (rwkv6, q = r, g = w, bonus u [H, K]):
                               o_t = scale q_t (S_{t-1} + diag(u) k_t^T v_t)

Every kernel runs one program per (V-block, batch * head) and keeps a [BK, BV]
float32 block of the state (or of its gradient) in registers, all of K in one block:
- `_fwd_kernel` steps forward in time: o and the final state.
- `_bwd_dq_kernel` steps forward again: dq and, when dg is needed, dq' (below)
  and, per chunk of CHUNK tokens, the leaving state less its last k^T v.
- `_bwd_dkv_kernel` steps backward with dS = dL/dS_t: dk, dv, dh0 and, when dg is
  needed, dk' and the boundary term of each chunk.
Sums over V (dq, dk, the boundary term) are per V-block partials reduced by torch.
A packed batch (cu_seqlens) runs on its chunk-aligned row (ops/common/varlen.py): one program per
(V-block, n * H + h) walks the chunks of sequence n alone (VARLEN), so each chunk of the gate
gradient's sums lies inside one sequence and ends where it ends.

The gate gradient. dL/dg_t = sum_v (exp(g_t) S_{t-1}) * dS_t per channel, and with
x_t = sum_v S_t * dS_t the recurrences S_t = exp(g_t) S_{t-1} + k_t^T v_t and
dS_{t-1} = exp(g_t) dS_t + scale q_{t-1}^T do_{t-1} give, inside a chunk with last row L,
    dg_t = sum_v(S_L * dh_L) + sum_{s >= t} q_s dq_s - sum_{s >= t} k_s dk_s
with dq_s = scale S_s do_s, dk_s = dS_s v_s and dh_L = exp(g_{L+1}) dS_{L+1} (dht after the
last token): `chunk_gate_grad` with q_reads_current=True. Three kinds of terms there carry no
gate of the chunk: q_s dq_s and k_s dk_s both hold scale (q_s * k_s)(v_s . do_s) (the
token's own k_s^T v_s read by its own q_s), and the boundary holds k_L (dh_L v_L), which
k_L dk_L holds too. They cancel only in exact arithmetic; under strong decay they are O(1)
while dg is tiny (exactly 0 at T = 1 without an initial state). The kernels hand
chunk_gate_grad the same sums without them:
    dq'_s = scale (exp(g_s) S_{s-1}) do_s                        (S_s less k_s^T v_s)
    dk'_s = (exp(g_{s+1}) dS_{s+1}) v_s for s < L,   dk'_L = 0   (dS_s less scale q_s^T do_s)
    boundary' = sum_v (exp(g_L) S_{L-1}) * dh_L                  (S_L less k_L^T v_L)
    dg_t = boundary' + sum_{t <= s <= L} q_s dq'_s - sum_{t <= s < L} k_s dk'_s
Every term left carries a gate of the chunk. The scalar gate's gradient is that per-channel
formula summed over K (in torch, after chunk_gate_grad).

With READS_PREVIOUS token s reads S_{s-1}, so its q-sum runs over s > t (q_reads_current=False),
dq_s = scale S_{s-1} do_s, and the gate-free pair is q_s with k_{s-1}:
    dq'_s = scale (exp(g_{s-1}) S_{s-2}) do_s     (S_{s-1} less k_{s-1}^T v_{s-1})
    dk'_s = (exp(g_{s+1}) dS_{s+1}) v_s for s < L,   dk'_L = 0   (dS_s less scale q_{s+1}^T do_{s+1})
    boundary' = sum_v (exp(g_L) S_{L-1}) * dS_L
    dg_t = boundary' + sum_{t < s <= L} q_s dq'_s - sum_{t <= s < L} k_s dk'_s
(dq' of a chunk's first row is never read). The bonus adds u k_s (v_s . do_s) to dq, the
matching terms to dk and dv, and du = sum_s q_s k_s (v_s . do_s).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.autograd import needed, save_context, upstream
from fla_kernels.ops.common.gate_grad import chunk_gate_grad
from fla_kernels.ops.common.launch import compiles_ahead, flat_grid, launch
from fla_kernels.ops.common.partials import sum_parts
from fla_kernels.ops.common.tiles import flat_program, initial_block, load_state, store_state
from fla_kernels.ops.common.varlen import Packing, apply_packed, sequence_walk, state_count
from fla_kernels.precision import store_dtype

CHUNK = 64  # tokens per chunk of the gate-gradient sums

GATE_NONE, GATE_SCALAR, GATE_CHANNEL = 0, 1, 2


@triton.jit
def _gate_ptr(g, token, K: tl.constexpr, o_k, GATE: tl.constexpr):
    """Pointer(s) to the gate of a token (flat int64 index (b * T + t) * H + h): a [BK] block
    (GATE_CHANNEL) or a scalar (GATE_SCALAR)."""
    if GATE == 2:
        return g + token * K + o_k
    else:
        return g + token


@triton.jit
def _decay(p_g, m_k, GATE: tl.constexpr):
    """exp(g_t) shaped to scale a [BK, BV] block: [BK, 1] (GATE_CHANNEL) or a scalar (GATE_SCALAR)."""
    if GATE == 2:
        return tl.exp(tl.load(p_g, mask=m_k, other=0).to(tl.float32))[:, None]
    else:
        return tl.exp(tl.load(p_g).to(tl.float32))


@triton.jit
def token_program(chunk_offsets, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, VARLEN: tl.constexpr):
    """(i_v, i_bh, i_b, i_h, i_row, c_lo, c_hi, o_k, o_v, m_k, m_v) of a program on the grid
    flat_grid(V-blocks, B * H), or flat_grid(V-blocks, N * H) with VARLEN (i_bh = n*H + h): its
    ids (int64) and walk (`sequence_walk`), its columns of K (all of them) and of V, and their
    masks."""
    i_v, _, i_bh = flat_program(tl.cdiv(V, BV), 1)
    i_v = i_v.to(tl.int64)
    i_b, i_h, i_row, c_lo, c_hi = sequence_walk(chunk_offsets, i_bh, NT, H, VARLEN)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    return i_v, i_bh, i_b, i_h, i_row, c_lo, c_hi, o_k, o_v, o_k < K, o_v < V


@triton.jit
def token_row(x, token, D: tl.constexpr, o_d, m_d):
    """[BD] float32 row o_d of x [B, T, H, D] at the flat token index (b * T + t) * H + h."""
    return tl.load(x + token * D + o_d, mask=m_d, other=0).to(tl.float32)


@triton.jit(do_not_specialize=["T", "NT"])
def _fwd_kernel(q, k, v, g, u, h0, o, ht, chunk_offsets, scale, T, NT, H: tl.constexpr,
                K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, GATE: tl.constexpr, READS_PREVIOUS: tl.constexpr,
                USE_H0: tl.constexpr, STORE_HT: tl.constexpr, VARLEN: tl.constexpr):
    """o [B, T, H, V] in o's dtype; ht [B, H, K, V] float32 when STORE_HT (with VARLEN: the
    tokens of each sequence's chunks, ht [N, H, K, V])."""
    i_v, i_bh, i_b, i_h, i_row, c_lo, c_hi, o_k, o_v, m_k, m_v = token_program(
        chunk_offsets, NT, H, K, V, BK, BV, VARLEN)
    if READS_PREVIOUS:
        b_u = tl.load(u + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_h = initial_block(h0, i_bh, K, V, BK, BV, 0, i_v, USE_H0, False)
    for t in range(c_lo * BT, tl.minimum(c_hi * BT, T)):
        token = (i_b * T + t) * H + i_h
        b_q = token_row(q, token, K, o_k, m_k) * scale
        b_k = token_row(k, token, K, o_k, m_k)
        b_v = token_row(v, token, V, o_v, m_v)
        b_kv = b_k[:, None] * b_v[None, :]
        if READS_PREVIOUS:
            b_o = tl.sum(b_q[:, None] * (b_h + b_u[:, None] * b_kv), axis=0)
        if GATE != 0:
            b_h = b_h * _decay(_gate_ptr(g, token, K, o_k, GATE), m_k, GATE)
        b_h += b_kv
        if not READS_PREVIOUS:
            b_o = tl.sum(b_q[:, None] * b_h, axis=0)
        tl.store(o + token * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    if STORE_HT:
        store_state(ht, i_bh, b_h, K, V, BK, BV, 0, i_v, False)


@triton.jit(do_not_specialize=["T", "NT", "B"])
def _bwd_dq_kernel(k, v, g, u, h0, do, dq, dqs, states, chunk_offsets, scale, T, NT, B,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr,
                   READS_PREVIOUS: tl.constexpr, USE_H0: tl.constexpr, NEED_DG: tl.constexpr,
                   VARLEN: tl.constexpr):
    """Forward in time. Per V-block partials [NV, B, T, H, K] float32 of dq (through the state
    read and, with READS_PREVIOUS, the bonus) and, when NEED_DG, dq' (through the state read less
    its last k^T v; garbage in a chunk's first row with READS_PREVIOUS, which is never read);
    states [B, H, NT, K, V] float32: the state leaving each chunk less the chunk's last k^T v
    (each program writes its V columns)."""
    i_v, i_bh, i_b, i_h, i_row, c_lo, c_hi, o_k, o_v, m_k, m_v = token_program(
        chunk_offsets, NT, H, K, V, BK, BV, VARLEN)
    if READS_PREVIOUS:
        b_u = tl.load(u + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_h = initial_block(h0, i_bh, K, V, BK, BV, 0, i_v, USE_H0, False)  # the state after the previous token
    b_hd = b_h  # the same less that token's k^T v (a stand-in before the first token)
    for i_c in range(c_lo, c_hi):
        for j in range(tl.minimum(T - i_c * BT, BT)):
            token = (i_b * T + i_c * BT + j) * H + i_h
            b_k = token_row(k, token, K, o_k, m_k)
            b_v = token_row(v, token, V, o_v, m_v)
            b_do = token_row(do, token, V, o_v, m_v) * scale
            if READS_PREVIOUS:
                b_dq = tl.sum(b_h * b_do[None, :], axis=1) + b_u * b_k * tl.sum(b_v * b_do, axis=0)
                b_dqs = tl.sum(b_hd * b_do[None, :], axis=1)
            if GATE != 0:
                b_hd = b_h * _decay(_gate_ptr(g, token, K, o_k, GATE), m_k, GATE)
            else:
                b_hd = b_h
            b_h = b_hd + b_k[:, None] * b_v[None, :]
            if not READS_PREVIOUS:
                b_dq = tl.sum(b_h * b_do[None, :], axis=1)
                b_dqs = tl.sum(b_hd * b_do[None, :], axis=1)
            part = (i_v * B * T * H + token) * K + o_k
            tl.store(dq + part, b_dq, mask=m_k)
            if NEED_DG:
                tl.store(dqs + part, b_dqs, mask=m_k)
        if NEED_DG:
            store_state(states, i_row * NT + i_c, b_hd, K, V, BK, BV, 0, i_v, False)


@triton.jit(do_not_specialize=["T", "NT", "B"])
def _bwd_dkv_kernel(q, k, v, g, u, do, dht, states, dk, dks, dv, du, dh0, bound, chunk_offsets,
                    scale, T, NT, B, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr,
                    READS_PREVIOUS: tl.constexpr, USE_DHT: tl.constexpr,
                    STORE_DH0: tl.constexpr, NEED_DG: tl.constexpr, VARLEN: tl.constexpr):
    """Backward in time. Per V-block partials (float32): dk and, when NEED_DG, dk' [NV, B, T, H, K]
    and boundary' [NV, B, H, NT, K]; with READS_PREVIOUS, du per chunk [NV, B, H, NT, K] (summed
    by torch, pairwise: a serial fp32 sum over a long sequence loses ~sqrt(T) ulps); dv in dv's
    dtype; dh0 [B, H, K, V] float32 when STORE_DH0. See the module docstring.

    Two gradients are carried: dS = dL/dS_t (b_dS) and exp(g_{t+1}) dS_{t+1} (b_dh): dS_t less
    the direct read of S_t (by q_t, or by q_{t+1} with READS_PREVIOUS), which dk' needs."""
    i_v, i_bh, i_b, i_h, i_row, c_lo, c_hi, o_k, o_v, m_k, m_v = token_program(
        chunk_offsets, NT, H, K, V, BK, BV, VARLEN)
    if READS_PREVIOUS:
        b_u = tl.load(u + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_dh = initial_block(dht, i_bh, K, V, BK, BV, 0, i_v, USE_DHT, False)
    b_dS = b_dh
    for i in range(c_hi - c_lo):
        i_c = c_hi - 1 - i
        if NEED_DG:
            # the gradient reaching the leaving state from outside the chunk
            if READS_PREVIOUS:
                b_out = b_dS
            else:
                b_out = b_dh
            b_s = load_state(states, i_row * NT + i_c, K, V, BK, BV, 0, i_v, False)
            tl.store(bound + ((i_v * B * H + i_row) * NT + i_c) * K + o_k,
                     tl.sum(b_s * b_out, axis=1), mask=m_k)
        b_duc = tl.zeros([BK], dtype=tl.float32)
        n = tl.minimum(T - i_c * BT, BT)
        for j in range(n):
            # the chunk's rows from its last (j = 0) back to its first
            token = (i_b * T + i_c * BT + n - 1 - j) * H + i_h
            b_q = token_row(q, token, K, o_k, m_k) * scale
            b_k = token_row(k, token, K, o_k, m_k)
            b_v = token_row(v, token, V, o_v, m_v)
            b_do = token_row(do, token, V, o_v, m_v)
            part = (i_v * B * T * H + token) * K + o_k
            if not READS_PREVIOUS:
                b_dS = b_dh + b_q[:, None] * b_do[None, :]
            if NEED_DG:
                # the chunk's last row (j = 0) keeps no dk': its path into the leaving state
                # is left out of the boundary term as well
                b_dks = tl.sum(b_dh * b_v[None, :], axis=1)
                tl.store(dks + part, tl.where(j > 0, b_dks, 0.0), mask=m_k)
            b_dk = tl.sum(b_dS * b_v[None, :], axis=1)
            b_dv = tl.sum(b_dS * b_k[:, None], axis=0)
            if READS_PREVIOUS:
                b_vdo = tl.sum(b_v * b_do, axis=0)
                b_dk += b_q * b_u * b_vdo
                b_dv += tl.sum(b_q * b_u * b_k, axis=0) * b_do
                b_duc += b_q * b_k * b_vdo
            tl.store(dk + part, b_dk, mask=m_k)
            tl.store(dv + token * V + o_v, b_dv.to(dv.dtype.element_ty), mask=m_v)
            if GATE != 0:
                b_dh = b_dS * _decay(_gate_ptr(g, token, K, o_k, GATE), m_k, GATE)
            else:
                b_dh = b_dS
            if READS_PREVIOUS:
                b_dS = b_dh + b_q[:, None] * b_do[None, :]
        if READS_PREVIOUS:
            tl.store(du + ((i_v * B * H + i_row) * NT + i_c) * K + o_k, b_duc, mask=m_k)
    if STORE_DH0:
        if READS_PREVIOUS:
            store_state(dh0, i_bh, b_dS, K, V, BK, BV, 0, i_v, False)
        else:
            store_state(dh0, i_bh, b_dh, K, V, BK, BV, 0, i_v, False)


def _blocks(K, V):
    """(BK, BV, NV, num_warps): all of K in one block, V split in blocks of at most 32."""
    BK = triton.next_power_of_2(K)
    BV = min(triton.next_power_of_2(V), 32)
    return BK, BV, triton.cdiv(V, BV), (8 if BK * BV >= 8192 else 4)


def gate_mode(g) -> int:
    """GATE_NONE, GATE_SCALAR ([B, T, H]) or GATE_CHANNEL ([B, T, H, K])."""
    if g is None:
        return GATE_NONE
    return GATE_SCALAR if g.dim() == 3 else GATE_CHANNEL


class FusedRecurrentFunction(torch.autograd.Function):
    """Autograd wrapper around the three token-by-token kernels and chunk_gate_grad.

    g may be None (no decay; its gradient is None), [B, T, H] or [B, T, H, K]; u ([H, K], or None)
    selects the rwkv6 form, whose output reads the previous state plus the bonus. chunk_offsets:
    None, or those of a packed batch's sequences on its aligned row (B = 1, ops/common/varlen.py):
    initial and final state [N, H, K, V].
    """

    @staticmethod
    def parts_per_row(tensors) -> int:
        """The backward's float32 partials per batch entry: dq, dk, dq' and dk', NV of each
        (ops/common/batch_groups.py)."""
        q, v = tensors[0], tensors[2]
        _, T, H, K = q.shape
        return 4 * _blocks(K, v.shape[-1])[2] * T * H * K

    @staticmethod
    @compiles_ahead
    def forward(ctx, q, k, v, g, u, scale, initial_state, output_final_state, chunk_offsets=None):
        q, k, v = (x.contiguous() for x in (q, k, v))
        g, u = (None if x is None else x.contiguous() for x in (g, u))
        h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
        B, T, H, K = q.shape
        V = v.shape[-1]
        N = state_count(B, chunk_offsets)
        BK, BV, NV, num_warps = _blocks(K, V)
        gate = gate_mode(g)
        o = torch.empty(B, T, H, V, dtype=store_dtype(v.dtype), device=v.device)
        ht = torch.empty(N, H, K, V, dtype=torch.float32, device=v.device) if output_final_state else None
        launch(_fwd_kernel, flat_grid(NV, N * H),
            q, k, v, g, u, h0, o, ht, chunk_offsets, scale, T, triton.cdiv(T, CHUNK), H=H, K=K,
            V=V, BT=CHUNK, BK=BK, BV=BV, GATE=gate, READS_PREVIOUS=u is not None,
            USE_H0=h0 is not None, STORE_HT=output_final_state,
            VARLEN=chunk_offsets is not None, num_warps=num_warps)
        save_context(ctx, scale, output_final_state, q, k, v, g, u, h0, chunk_offsets=chunk_offsets,
                     initial_state=initial_state)
        ctx.set_materialize_grads(False)
        return o.to(v.dtype), ht

    @staticmethod
    @compiles_ahead
    def backward(ctx, do, dht):
        q, k, v, g, u, h0 = ctx.saved_tensors
        need_q, need_k, need_v, need_g, need_u, _, need_h0 = ctx.needs_input_grad[:7]
        need_g = need_g and g is not None
        reads_previous = u is not None
        scale, gate = ctx.scale, gate_mode(g)
        B, T, H, K = q.shape
        V = v.shape[-1]
        N = state_count(B, ctx.chunk_offsets)
        BK, BV, NV, num_warps = _blocks(K, V)
        NT = triton.cdiv(T, CHUNK)
        f32 = dict(dtype=torch.float32, device=q.device)
        modes = dict(H=H, K=K, V=V, BT=CHUNK, BK=BK, BV=BV, GATE=gate, READS_PREVIOUS=reads_previous,
                     NEED_DG=need_g, VARLEN=ctx.chunk_offsets is not None, num_warps=num_warps)
        do, dht = upstream(ctx, v, do, dht)
        dq = dqs = dk = dks = dv = du = dh0 = dg = None

        states = torch.empty(B, H, NT, K, V, **f32) if need_g else None
        if need_q or need_g:
            dq = torch.empty(NV, B, T, H, K, **f32)
            dqs = torch.empty(NV, B, T, H, K, **f32) if need_g else dq  # dq: a never-written stand-in
            launch(_bwd_dq_kernel, flat_grid(NV, N * H), k, v, g, u, h0, do, dq, dqs, states,
                   ctx.chunk_offsets, scale, T, NT, B, USE_H0=h0 is not None, **modes)
        if need_k or need_v or need_g or need_u or need_h0:
            dk = torch.empty(NV, B, T, H, K, **f32)
            dks = torch.empty(NV, B, T, H, K, **f32) if need_g else dk  # dk: a never-written stand-in
            dv = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=v.device)
            du = torch.empty(NV, B, H, NT, K, **f32) if reads_previous else None
            dh0 = torch.empty(N, H, K, V, **f32) if need_h0 else None
            bound = torch.empty(NV, B, H, NT, K, **f32) if need_g else None
            launch(_bwd_dkv_kernel, flat_grid(NV, N * H), q, k, v, g, u, do, dht, states, dk, dks,
                   dv, du, dh0, bound, ctx.chunk_offsets, scale, T, NT, B, USE_DHT=dht is not None,
                   STORE_DH0=need_h0, **modes)
            if need_g:
                per_channel = gate == GATE_CHANNEL
                dg = chunk_gate_grad(q, sum_parts(dqs, torch.float32), k, sum_parts(dks, torch.float32),
                                     bound.sum(0), CHUNK,
                                     q_reads_current=not reads_previous,
                                     out_dtype=store_dtype(g.dtype) if per_channel else torch.float32)
                dg = (dg if per_channel else dg.sum(-1)).to(g.dtype)
        return needed(
            ctx,
            sum_parts(dq, q.dtype) if need_q else None,
            sum_parts(dk, k.dtype) if need_k else None,
            dv.to(v.dtype) if need_v else None,
            dg,
            du.sum((0, 1, 3)).to(u.dtype) if need_u else None,
            None,
            dh0.to(ctx.h0_dtype) if need_h0 else None,
            None,
            None,
        )


def fused_recurrent(q, k, v, g, scale, initial_state, output_final_state, u=None, cu_seqlens=None):
    """The shared launcher; the public functions check their arguments and call this.

    With u (rwkv6's bonus, [H, K]) o_t = scale q_t (S_{t-1} + diag(u) k_t^T v_t); else o_t = scale q_t S_t.
    cu_seqlens: None, or a packed batch's checked sequence starts (host ints, `check_inputs`'s
    sizes["cu_seqlens"]), run on its aligned row (ops/common/varlen.py).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    packing = None if cu_seqlens is None else Packing(cu_seqlens, CHUNK, q.device)
    return apply_packed(FusedRecurrentFunction, packing, (q, k, v, g, u), (True, True, True, True, False),
                        scale, initial_state, bool(output_final_state))
