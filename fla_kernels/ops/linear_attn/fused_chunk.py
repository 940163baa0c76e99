"""Linear attention, fused chunks: one kernel walks the chunks in order with the state in registers.

Per (batch, head), with state S of shape [K, V]:
    S_t = S_{t-1} + k_t^T v_t,     o_t = scale * q_t S_t
Inside chunk c (rows i, j), with h_c the state entering it:
    o_i     = scale * (q_i h_c + sum_{j <= i} (q_i . k_j) v_j)
    h_{c+1} = h_c + k^T v

`_fwd_kernel`: one program per (V-block, K-block, b*h) carries its [BK, BV] block of
the state through the chunks; o is summed over K-blocks by torch when K spans several.
`_bwd_kernel`: the same programs walk the chunks forward with the state (dq), then
backward with its gradient dh (dk, dv, dh0):
    dq_i = scale * (do_i h_c^T + sum_{j <= i} (do_i . v_j) k_j)
    dk_j = v_j dh_c^T + scale * sum_{i >= j} (do_i . v_j) q_i
    dv_j = k_j dh_c + scale * sum_{i >= j} (q_i . k_j) do_i
with dh_c the gradient w.r.t. the state leaving chunk c (dht after the last).
Partial sums over the other head dimension (dq, dk over V-blocks, dv over K-blocks)
are reduced by `sum_parts`. k_j dh_c keeps about 21 bits of the carried dh (`mma_tf32_split_rhs`:
one bf16 rounding of it, shared by the chunk's rows, put dv's sums over tokens at 1.25 times their
bound with positive keys, normalize=True on the H100). Every product is a dot of loaded tiles (read transposed where
needed): no dot ever takes the transpose of another dot's result or of the carried
state; dq and dk are formed transposed and stored through transposed offsets.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.autograd import apply_checked, input_grads, save_context, upstream
from fla_kernels.ops.common.dot import add_rounded, mma, mma_tf32_split_rhs
from fla_kernels.ops.common.launch import LaunchSizes, compiles_ahead, flat_grid, launch
from fla_kernels.ops.common.partials import sum_parts
from fla_kernels.ops.common.tiles import (head_program, initial_block, load_rows, load_rows_t,
                                          store_rows, store_state)
from fla_kernels.ops.linear_attn.normalize import normalized
from fla_kernels.precision import store_dtype

BT = 64  # tokens per chunk


@triton.jit
def _store_rows_t(x, val, base, t0, T, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
                  BD: tl.constexpr, i_d):
    """Store a [BD, BR] tile (rows of x along its columns) into x [B, T, H, D] at rows t0.."""
    t = t0 + tl.arange(0, BR)
    d = i_d * BD + tl.arange(0, BD)
    offs = base + t.to(tl.int64)[None, :] * (H * D) + d[:, None]
    tl.store(x + offs, val.to(x.dtype.element_ty), mask=(t[None, :] < T) & (d[:, None] < D))


@triton.jit(do_not_specialize=["T", "NT", "B"])
def _fwd_kernel(q, k, v, h0, o, ht, scale, T, NT, B, H: tl.constexpr, K: tl.constexpr,
                V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                USE_H0: tl.constexpr, STORE_HT: tl.constexpr, FP32_DOT: tl.constexpr,
                OPERAND_DTYPE: tl.constexpr):
    """o [NK, B, T, H, V] (this K-block's share in slot i_k); ht [B, H, K, V] float32 when STORE_HT."""
    i_v, i_k, i_bh, i_b, i_h, row = head_program(T, H, tl.cdiv(V, BV), tl.cdiv(K, BK))
    base_k, base_v = row * K, row * V
    base_o = ((i_k * B + i_b) * T * H + i_h) * V
    o_i = tl.arange(0, BT)
    causal = o_i[:, None] >= o_i[None, :]
    b_h = initial_block(h0, i_bh, K, V, BK, BV, i_k, i_v, USE_H0, False)
    for i_c in range(NT):
        c0 = i_c * BT
        b_q = load_rows(q, base_k, c0, T, H, K, BT, BK, i_k)
        b_kt = load_rows_t(k, base_k, c0, T, H, K, BT, BK, i_k)
        b_v = load_rows(v, base_v, c0, T, H, V, BT, BV, i_v)
        b_A = tl.where(causal, mma(b_q, b_kt, FP32_DOT, OPERAND_DTYPE), 0.0)
        b_o = mma(b_q, b_h, FP32_DOT, OPERAND_DTYPE) + mma(b_A, b_v, FP32_DOT, OPERAND_DTYPE)
        store_rows(o, b_o * scale, base_o, c0, T, H, V, BT, BV, i_v)
        b_h = add_rounded(b_h, mma(b_kt, b_v, FP32_DOT, OPERAND_DTYPE))
    if STORE_HT:
        store_state(ht, i_bh, b_h, K, V, BK, BV, i_k, i_v, False)


@triton.jit(do_not_specialize=["T", "NT", "B"])
def _bwd_kernel(q, k, v, do, h0, dht, dq, dk, dv, dh0, scale, T, NT, B, H: tl.constexpr,
                K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, USE_H0: tl.constexpr, USE_DHT: tl.constexpr,
                STORE_DH0: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """Partials, float32: dq, dk [NV, B, T, H, K] (slot i_v), dv [NK, B, T, H, V] (slot i_k);
    dh0 [B, H, K, V] float32 when STORE_DH0."""
    i_v, i_k, i_bh, i_b, i_h, row = head_program(T, H, tl.cdiv(V, BV), tl.cdiv(K, BK))
    base_k, base_v = row * K, row * V
    base_dk = ((i_v * B + i_b) * T * H + i_h) * K
    base_dv = ((i_k * B + i_b) * T * H + i_h) * V
    o_i = tl.arange(0, BT)
    lower_t = o_i[:, None] <= o_i[None, :]  # [j, i]: j <= i

    # forward through the chunks with the state: dq^T = scale * (h_c do^T + k^T dA^T)
    b_h = initial_block(h0, i_bh, K, V, BK, BV, i_k, i_v, USE_H0, False)
    for i_c in range(NT):
        c0 = i_c * BT
        b_kt = load_rows_t(k, base_k, c0, T, H, K, BT, BK, i_k)
        b_v = load_rows(v, base_v, c0, T, H, V, BT, BV, i_v)
        b_dot = load_rows_t(do, base_v, c0, T, H, V, BT, BV, i_v)
        b_dAt = tl.where(lower_t, mma(b_v, b_dot, FP32_DOT, OPERAND_DTYPE), 0.0)  # [j, i] = v_j . do_i
        b_dqt = mma(b_h, b_dot, FP32_DOT, OPERAND_DTYPE) + mma(b_kt, b_dAt, FP32_DOT, OPERAND_DTYPE)
        _store_rows_t(dq, b_dqt * scale, base_dk, c0, T, H, K, BT, BK, i_k)
        b_h = add_rounded(b_h, mma(b_kt, b_v, FP32_DOT, OPERAND_DTYPE))

    # backward through the chunks with dh = dL/d(state leaving the chunk)
    lower = o_i[:, None] >= o_i[None, :]    # [i, j]: i >= j
    b_dh = initial_block(dht, i_bh, K, V, BK, BV, i_k, i_v, USE_DHT, False)
    for i_r in range(NT):
        c0 = (NT - 1 - i_r) * BT
        b_qt = load_rows_t(q, base_k, c0, T, H, K, BT, BK, i_k) * scale
        b_k = load_rows(k, base_k, c0, T, H, K, BT, BK, i_k)
        b_vt = load_rows_t(v, base_v, c0, T, H, V, BT, BV, i_v)
        b_do = load_rows(do, base_v, c0, T, H, V, BT, BV, i_v)
        b_dA = tl.where(lower, mma(b_do, b_vt, FP32_DOT, OPERAND_DTYPE), 0.0)   # [i, j] = do_i . v_j
        b_At = tl.where(lower_t, mma(b_k, b_qt, FP32_DOT, OPERAND_DTYPE), 0.0)  # [j, i] = scale k_j . q_i
        b_dkt = mma(b_dh, b_vt, FP32_DOT, OPERAND_DTYPE) + mma(b_qt, b_dA, FP32_DOT, OPERAND_DTYPE)
        b_dv = mma_tf32_split_rhs(b_k, b_dh, FP32_DOT) + mma(b_At, b_do, FP32_DOT, OPERAND_DTYPE)
        _store_rows_t(dk, b_dkt, base_dk, c0, T, H, K, BT, BK, i_k)
        store_rows(dv, b_dv, base_dv, c0, T, H, V, BT, BV, i_v)
        b_dh = add_rounded(b_dh, mma(b_qt, b_do, FP32_DOT, OPERAND_DTYPE))
    if STORE_DH0:
        store_state(dh0, i_bh, b_dh, K, V, BK, BV, i_k, i_v, False)


class _Launch(LaunchSizes):
    """`LaunchSizes` over chunks of BT, with the grid flat_grid(V-blocks, K-blocks, B * H) and the
    warps."""

    def __init__(self, q, v):
        super().__init__(q, v, BT)
        self.grid = flat_grid(self.NV, self.NK, self.B * self.H)
        # fp32 IEEE dots run on the FMA units: more warps share the [BT, BT] products
        # (and halve the compile time of the backward)
        self.num_warps = 8 if self.dots["FP32_DOT"] and self.BK * self.BV >= 4096 else 4


class FusedChunkLinearAttnFunction(torch.autograd.Function):
    """Autograd wrapper around the two fused kernels; saves only the inputs."""

    @staticmethod
    @compiles_ahead
    def forward(ctx, q, k, v, scale, initial_state, output_final_state):
        L = _Launch(q, v)
        # one K-block writes o directly (in the output's store dtype); several write fp32 partials
        o = torch.empty(L.NK, *v.shape, dtype=store_dtype(v.dtype) if L.NK == 1 else torch.float32,
                        device=v.device)
        ht = torch.empty(L.B, L.H, L.K, L.V, dtype=torch.float32, device=v.device) if output_final_state else None
        launch(_fwd_kernel, L.grid,
            q, k, v, initial_state, o, ht, scale, L.T, L.NT, L.B, L.H, L.K, L.V, BT=BT, BK=L.BK,
            BV=L.BV, USE_H0=initial_state is not None, STORE_HT=output_final_state, num_warps=L.num_warps,
            **L.dots)
        save_context(ctx, scale, output_final_state, q, k, v, initial_state)
        ctx.set_materialize_grads(False)
        return sum_parts(o, v.dtype), ht

    @staticmethod
    @compiles_ahead
    def backward(ctx, do, dht):
        q, k, v, initial_state = ctx.saved_tensors
        L = _Launch(q, v)
        do, dht = upstream(ctx, v, do, dht)
        f32 = dict(dtype=torch.float32, device=q.device)
        dq = torch.empty(L.NV, *q.shape, **f32)
        dk = torch.empty(L.NV, *k.shape, **f32)
        dv = torch.empty(L.NK, *v.shape, **f32)
        need_h0 = initial_state is not None and ctx.needs_input_grad[4]
        dh0 = torch.empty(L.B, L.H, L.K, L.V, **f32) if need_h0 else None
        launch(_bwd_kernel, L.grid,
            q, k, v, do, initial_state, dht, dq, dk, dv, dh0, ctx.scale, L.T, L.NT, L.B, L.H, L.K, L.V,
            BT=BT, BK=L.BK, BV=L.BV, USE_H0=initial_state is not None, USE_DHT=dht is not None,
            STORE_DH0=need_h0, num_warps=L.num_warps, **L.dots)
        grads = (sum_parts(dq, q.dtype), sum_parts(dk, k.dtype), sum_parts(dv, v.dtype))
        return input_grads(ctx, grads, dh0, initial_state)


def fused_chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                            normalize=False):
    """Linear attention with the chunks walked by one kernel: returns (o [B, T, H, V] in the inputs'
    dtype, final state [B, H, K, V] float32 or None).

    q, k: [B, T, H, K]; v: [B, T, H, V]; one dtype (fp32, fp16 or bf16). scale defaults to
    K ** -0.5; initial_state: [B, H, K, V] float32 or None. Differentiable in q, k, v and
    initial_state.

    normalize=True divides o by the running key sum (`normalize.py`); the state is then the pair
    (S [B, H, K, V], z [B, 1, H, K]) float32, as initial_state (or S alone: z0 = 0) and as final
    state.
    """
    if normalize:
        return normalized(fused_chunk_linear_attn, "fused_chunk_linear_attn", q, k, v, scale,
                          initial_state, output_final_state)
    return apply_checked(FusedChunkLinearAttnFunction, "fused_chunk_linear_attn",
                         dict(q=q, k=k, v=v), dict(q="BTHK", k="BTHK", v="BTHV"), scale,
                         initial_state, output_final_state)
