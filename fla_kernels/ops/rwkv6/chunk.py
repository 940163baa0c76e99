"""RWKV6, chunked: forward and backward Triton kernels over chunks of BT = 64 tokens.

Per (batch, head), with state S of shape [K, V]:
    o_t = scale * r_t (S_{t-1} + diag(u) k_t^T v_t)
    S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t

The kernels are shared with gla, which differs only in reading S_t instead of
S_{t-1} plus the u bonus: see ops/common/chunk_gated.py (READS_PREVIOUS=True
here) for the algorithm, the sub-chunk products, and why no exponent is ever
positive.
"""
from __future__ import annotations

import torch

from fla_kernels.ops.common.autograd import apply_checked, input_grads, save_context, upstream
from fla_kernels.ops.common.chunk_gated import BT, chunk_gated_bwd, chunk_gated_fwd
from fla_kernels.ops.common.launch import compiles_ahead


def _forward(r, k, v, w, u, scale, initial_state, chunk_offsets=None):
    """(o, final state [B, H, K, V] float32, the scores A)."""
    return chunk_gated_fwd(r, k, v, w, u, scale, initial_state, reads_previous=True,
                           chunk_offsets=chunk_offsets)


def _backward(r, k, v, w, u, scale, initial_state, do, dht, A=None, chunk_offsets=None):
    """(dr, dk, dv, dw, du, dh0 or None); dht may be None (no gradient from the final state)."""
    return chunk_gated_bwd(r, k, v, w, u, scale, initial_state, do, dht, reads_previous=True, A=A,
                           chunk_offsets=chunk_offsets)


class ChunkRWKV6Function(torch.autograd.Function):
    """Autograd wrapper: saves the inputs and the intra-chunk scores; backward recomputes states."""

    @staticmethod
    @compiles_ahead
    def forward(ctx, r, k, v, w, u, scale, initial_state, output_final_state, chunk_offsets=None):
        o, final_state, A = _forward(r, k, v, w, u, scale, initial_state, chunk_offsets)
        final_state = final_state if output_final_state else None
        save_context(ctx, scale, output_final_state, r, k, v, w, u, initial_state, A,
                     chunk_offsets=chunk_offsets)
        return o, final_state

    @staticmethod
    @compiles_ahead
    def backward(ctx, do, dht):
        r, k, v, w, u, initial_state, A = ctx.saved_tensors
        do, dht = upstream(ctx, v, do, dht)
        dr, dk, dv, dw, du, dh0 = _backward(r, k, v, w, u, ctx.scale, initial_state, do, dht, A,
                                            ctx.chunk_offsets)
        return input_grads(ctx, (dr, dk, dv, dw, du), dh0, initial_state)


def chunk_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                cu_seqlens=None):
    """Chunked RWKV6: returns (o [B, T, H, V] in the inputs' dtype, final state [B, H, K, V] float32 or None).

    r, k, w: [B, T, H, K]; v: [B, T, H, V]; u: [H, K]; w is the log decay (<= 0);
    scale defaults to K ** -0.5; initial_state: [B, H, K, V] float32 or None.
    Differentiable in r, k, v, w, u and initial_state. cu_seqlens: None, or int32 / int64
    [N + 1], the cumulative starts of N sequences packed along T (B = 1), each run on its own
    (u shared): initial and final state [N, H, K, V].
    """
    return apply_checked(ChunkRWKV6Function, "chunk_rwkv6", dict(r=r, k=k, v=v, w=w, u=u),
                         dict(r="BTHK", k="BTHK", v="BTHV", w="BTHK", u="HK"), scale,
                         initial_state, output_final_state, cu_seqlens=cu_seqlens, chunk_size=BT)
