"""Gated slot attention (GSA) references: the recurrent loop (the definition) and a chunked form.

Per (batch, head), with M slots, a key state hk [K, M] and a value state hv [M, V]:
    hk_t = hk_{t-1} diag(exp(g_t)) + k_t^T s_t
    hv_t = diag(exp(g_t)) hv_{t-1} + s_t^T v_t
    o_t  = softmax(scale q_t hk_t) hv_t          (softmax over the M slots)
The state is the pair (hk, hv), both as initial and as final state. With g = None (the
ungated form) s sets its own decay, with z_t = log sum_{u <= t} exp(s_u) over the call:
    s'_t = exp(s_t - z_t),   g_t = z_{t-1} - z_t (0 at the first token)
and the recurrences run on (s', g). Both functions take and return the public signature of
the kernels and are differentiable in every input, the initial states included.
"""
from __future__ import annotations

import torch

from references.common import (chunk_inputs, chunked_scan, chunks_to_time, default_scale, map_chunk_groups,
                               recurrent_loop, start_state, work_dtype_of)


def _split_state(initial_state):
    if initial_state is None:
        return None, None
    hk0, hv0 = initial_state
    return hk0, hv0


def additive_gate(s):
    """(s', g) of the ungated form from s [B, T, H, M], in s's dtype (see the module docstring)."""
    z = torch.logcumsumexp(s, dim=1)
    g = torch.cat([torch.zeros_like(z[:, :1]), z[:, :-1] - z[:, 1:]], dim=1)
    return torch.exp(s - z), g


def gsa_recurrent(q, k, v, s, g=None, scale=None, initial_state=None, output_final_state=False):
    """Token-by-token loop in the inputs' dtype; autograd through it is linear in T."""
    if g is None:
        s, g = additive_gate(s)
    B, T, H, K = q.shape
    V, M = v.shape[-1], s.shape[-1]
    scale = default_scale(K, scale)
    hk0, hv0 = _split_state(initial_state)
    states = (start_state(hk0, q, (B, H, K, M)), start_state(hv0, q, (B, H, M, V)))

    def step(states, q_t, k_t, v_t, s_t, g_t):
        hk, hv = states
        decay = torch.exp(g_t)                                         # [B, H, M]
        hk = hk * decay[..., None, :] + k_t[..., :, None] * s_t[..., None, :]
        hv = decay[..., :, None] * hv + s_t[..., :, None] * v_t[..., None, :]
        p = torch.softmax(scale * torch.einsum("bhk,bhkm->bhm", q_t, hk), dim=-1)
        return (hk, hv), torch.einsum("bhm,bhmv->bhv", p, hv)

    o, states = recurrent_loop(step, states, q, k, v, s, g)
    return o, (states if output_final_state else None)


def gsa_chunked(q, k, v, s, g=None, scale=None, initial_state=None, output_final_state=False,
                chunk_size=16, operand_dtype=None):
    """Chunked form: the same numbers as the loop, far faster for long T.

    Two gated linear recurrences with the softmax between them:
    1. scores z_t = scale q_t hk_t for every t, from hk^T = diag(exp(g)) hk^T + s^T k
       (a GLA-like pass: keys s gated on the slot dimension, values k, read by q
       through a contraction over K);
    2. p = softmax(z); o_t = p_t hv_t, a GLA pass with queries p, keys s, values v.
    Stable under strong decay: only differences of chunk-local cumulative log gates
    that are <= 0 are ever exponentiated. `operand_dtype` rounds the operands of every
    matrix product to that dtype while gates, exponentials, the softmax, accumulations and
    the carried states stay in the working dtype (float64 for float64 inputs, float32
    otherwise), as rwkv6_chunked does. With g = None, s' and g are taken in the working dtype and
    s' is rounded to s's dtype, as a kernel in that dtype stores it.
    """
    if g is None:
        s_work, g = additive_gate(s.to(work_dtype_of(s.dtype)))
        s = s_work.to(s.dtype)
    T, out_dtype = q.shape[1], q.dtype
    # [B, H, N, C, D], zero-padded at the end: zero gates with zero k, s, v leave both states as they are.
    scale, rnd, (q, k, v, s, g) = chunk_inputs((q, k, v, s, g), scale, chunk_size, operand_dtype)
    B, H, N, C, K = q.shape
    M = s.shape[-1]
    G = torch.cumsum(g, dim=-2)               # inclusive chunk-local cumulative log gate [.., C, M]
    G_last = G[..., -1:, :]                   # [B, H, N, 1, M]
    s_to_end = s * torch.exp(G_last - G)      # s_j carried to the chunk end
    hk0, hv0 = _split_state(initial_state)

    # 1. scores: z_i = scale (exp(G_i) * (q_i hk_c) + sum_{j <= i} (q_i . k_j) s_j exp(G_i - G_j))
    inc_k = rnd(k).transpose(-1, -2) @ rnd(s_to_end)                       # [B, H, N, K, M]
    starts_k, final_k = chunked_scan(torch.exp(G_last), inc_k, hk0)
    A_qk = rnd(q) @ rnd(k).transpose(-1, -2)                                # [B, H, N, C, C]
    z_intra = map_chunk_groups(lambda a, x, gg: _slot_mix(rnd(a), rnd(x), gg), A_qk, s, G,
                               elements_per_chunk=B * H * C * C * M)
    z = scale * ((rnd(q) @ rnd(starts_k)) * torch.exp(G) + z_intra)
    p = torch.softmax(z, dim=-1)

    # 2. outputs: o_i = (p_i * exp(G_i)) hv_c + sum_{j <= i} A_ij v_j, A_ij = sum_m p_im s_jm exp(G_im - G_jm)
    inc_v = rnd(s_to_end).transpose(-1, -2) @ rnd(v)                       # [B, H, N, M, V]
    starts_v, final_v = chunked_scan(torch.exp(G_last).transpose(-1, -2), inc_v, hv0)
    A = map_chunk_groups(_intra_scores, p, s, G, elements_per_chunk=B * H * C * C * M)
    o = rnd(p * torch.exp(G)) @ rnd(starts_v) + rnd(A) @ rnd(v)
    return chunks_to_time(o, T, out_dtype), ((final_k, final_v) if output_final_state else None)


def _decay_weights(G):
    """W[i, j, m] = exp(G_im - G_jm) for j <= i, else 0; [..., C, M] -> [..., C, C, M]."""
    C = G.shape[-2]
    lower = torch.ones(C, C, dtype=torch.bool, device=G.device).tril()
    diff = G[..., :, None, :] - G[..., None, :, :]
    return torch.exp(diff.masked_fill(~lower[..., None], float("-inf")))


def _slot_mix(A, x, G):
    """out_im = sum_{j <= i} A_ij x_jm exp(G_im - G_jm); A [..., C, C], x, G [..., C, M]."""
    return (A[..., :, :, None] * x[..., None, :, :] * _decay_weights(G)).sum(-2)


def _intra_scores(p, s, G):
    """A_ij = sum_m p_im s_jm exp(G_im - G_jm) for j <= i, else 0; [..., C, M] -> [..., C, C]."""
    return (p[..., :, None, :] * s[..., None, :, :] * _decay_weights(G)).sum(-1)
