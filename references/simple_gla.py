"""Simple GLA references: the recurrent loop (the definition) and a chunked form.

Per (batch, head), with state S of shape [K, V] and one log gate g_t per head and step:
    S_t = exp(g_t) S_{t-1} + k_t^T v_t
    o_t = scale * q_t S_t
With g = None there is no decay: plain linear attention. g_gamma [H], a constant
log decay per head, stands for g (g_t = g_gamma at every step; not both). Both
functions take and return the public signature of the kernels and are
differentiable in every input, the initial state and g_gamma included.
"""
from __future__ import annotations

import torch

from references.common import (chunk_inputs, chunked_scan, chunks_to_time, default_scale, pad_time,
                               recurrent_loop, start_state)


def decay_gate(g, g_gamma, like):
    """The gate [B, T, H] of every step: g, or g_gamma [H] repeated over `like`'s [B, T, H]."""
    if g_gamma is None:
        return g
    if g is not None:
        raise ValueError("pass g or g_gamma, not both")
    return g_gamma.expand(like.shape[:3])


def simple_gla_recurrent(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                         output_final_state=False):
    """Token-by-token loop in the inputs' dtype; autograd through it is linear in T."""
    B, T, H, K = q.shape
    scale = default_scale(K, scale)
    g = decay_gate(g, g_gamma, q)

    def step(state, q_t, k_t, v_t, g_t):
        if g_t is not None:
            state = torch.exp(g_t)[..., None, None] * state
        state = state + k_t[..., :, None] * v_t[..., None, :]
        return state, scale * torch.einsum("bhk,bhkv->bhv", q_t, state)

    o, state = recurrent_loop(step, start_state(initial_state, q, (B, H, K, v.shape[-1])), q, k, v, g)
    return o, (state if output_final_state else None)


def simple_gla_chunked(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                       output_final_state=False, chunk_size=16, operand_dtype=None):
    """Chunked form: the same numbers as the loop, far faster for long T.

    Inside a chunk, with G the inclusive chunk-local cumulative log gate,
        o_i = scale * (exp(G_i) q_i h_c + sum_{j <= i} (q_i . k_j) exp(G_i - G_j) v_j)
        h_{c+1} = exp(G_last) h_c + sum_j exp(G_last - G_j) k_j^T v_j
    Only differences G_i - G_j with i >= j (<= 0) are exponentiated; the others
    are masked before the exponential, so strong decay stays finite.
    `operand_dtype` rounds the operands of every matrix product to that dtype
    while the rest stays in the working dtype (`references.common.chunk_inputs`).
    """
    T, out_dtype = q.shape[1], q.dtype
    g = decay_gate(g, g_gamma, q)
    scale, rnd, (q, k, v) = chunk_inputs((q, k, v), scale, chunk_size, operand_dtype)
    B, H, N, C, K = q.shape
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    scores = rnd(q) @ rnd(k).transpose(-1, -2)                      # [B, H, N, C, C]
    if g is None:
        A = scores.masked_fill(~causal, 0.0)
        k_to_end, q_from_start = k, q
        decays = torch.ones(B, H, N, 1, 1, dtype=q.dtype, device=q.device)
    else:
        # zero gates past T leave the state as is
        G = torch.cumsum(pad_time(g.to(q.dtype)[..., None], C)[..., 0], dim=-1)    # [B, H, N, C]
        diff = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf"))
        A = scores * torch.exp(diff)
        G_last = G[..., -1:]
        k_to_end = k * torch.exp(G_last - G)[..., None]
        q_from_start = q * torch.exp(G)[..., None]
        decays = torch.exp(G_last)[..., None]                      # [B, H, N, 1, 1]
    increments = rnd(k_to_end).transpose(-1, -2) @ rnd(v)          # [B, H, N, K, V]
    starts, final = chunked_scan(decays, increments, initial_state)   # states entering each chunk
    o = scale * (rnd(q_from_start) @ rnd(starts) + rnd(A) @ rnd(v))
    return chunks_to_time(o, T, out_dtype), (final if output_final_state else None)
