"""GLA, chunked: forward and backward Triton kernels over chunks of BT = 64 tokens.

Per (batch, head), with state S of shape [K, V]:
    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t
    o_t = scale * q_t S_t

The kernels are shared with rwkv6, which differs only in reading S_{t-1} plus
a u bonus: see ops/common/chunk_gated.py (READS_PREVIOUS=False here) for the
algorithm. In short: states entering each chunk by chunk_fwd_h; intra-chunk
scores from 16-row sub-chunks, off-diagonal blocks as dots of q * exp(pre) and
k * exp(to) (the reference point is the sub-chunk boundary, both exponents <= 0,
each a sum of gates taken in the kernel by a masked product), diagonal blocks as
levels of small dots (`diag_level_sums`); the backward reuses the forward's
scores, recomputes the states, takes dh from chunk_bwd_dh and dg from chunk_gate_grad with the
gate-free terms (the diagonal pairs q_i k_i, the last row's own path into the
leaving state) left out of both of its sides.
"""
from __future__ import annotations

import torch

from fla_kernels.ops.common.autograd import apply_checked, input_grads, save_context, upstream
from fla_kernels.ops.common.chunk_gated import BT, chunk_gated_bwd, chunk_gated_fwd
from fla_kernels.ops.common.launch import compiles_ahead

GLA_LAYOUTS = dict(q="BTHK", k="BTHK", v="BTHV", g="BTHK")  # the inputs' dimensions (`check_inputs`)


class ChunkGLAFunction(torch.autograd.Function):
    """Autograd wrapper: saves the inputs and the intra-chunk scores; backward recomputes states."""

    @staticmethod
    @compiles_ahead
    def forward(ctx, q, k, v, g, scale, initial_state, output_final_state, chunk_offsets=None):
        o, final_state, A = chunk_gated_fwd(q, k, v, g, None, scale, initial_state, reads_previous=False,
                                            chunk_offsets=chunk_offsets)
        final_state = final_state if output_final_state else None
        save_context(ctx, scale, output_final_state, q, k, v, g, initial_state, A,
                     chunk_offsets=chunk_offsets)
        return o, final_state

    @staticmethod
    @compiles_ahead
    def backward(ctx, do, dht):
        q, k, v, g, initial_state, A = ctx.saved_tensors
        do, dht = upstream(ctx, v, do, dht)
        dq, dk, dv, dg, _, dh0 = chunk_gated_bwd(q, k, v, g, None, ctx.scale, initial_state, do, dht,
                                                 reads_previous=False, A=A,
                                                 chunk_offsets=ctx.chunk_offsets)
        return input_grads(ctx, (dq, dk, dv, dg), dh0, initial_state)


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Chunked GLA: returns (o [B, T, H, V] in the inputs' dtype, final state [B, H, K, V] float32 or None).

    q, k, g: [B, T, H, K]; v: [B, T, H, V]; g is the log gate (<= 0);
    scale defaults to K ** -0.5; initial_state: [B, H, K, V] float32 or None.
    Differentiable in q, k, v, g and initial_state. cu_seqlens: None, or int32 / int64 [N + 1],
    the cumulative starts of N sequences packed along T (B = 1), each run on its own: initial
    and final state [N, H, K, V].
    """
    return apply_checked(ChunkGLAFunction, "chunk_gla", dict(q=q, k=k, v=v, g=g), GLA_LAYOUTS, scale,
                         initial_state, output_final_state, cu_seqlens=cu_seqlens, chunk_size=BT)
