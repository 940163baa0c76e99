"""The chunked form shared by the per-channel gated references, GLA and RWKV6 (as the kernels
share fla_kernels/ops/common/chunk_gated.py).

Per (batch, head), with state S of shape [K, V] and log gates g_t [K]:
    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t
    GLA:   o_t = scale * q_t S_t                               (reads the state including step t)
    RWKV6: o_t = scale * q_t (S_{t-1} + diag(u) k_t^T v_t)     (reads the state before step t)
"""
from __future__ import annotations

import torch

from references.common import chunk_inputs, chunked_scan, chunks_to_time, gated_scores, map_chunk_groups


def chunk_gated(q, k, v, g, u, scale, initial_state, output_final_state, chunk_size, operand_dtype):
    """GLA's chunked form with u None, RWKV6's with u [H, K]: the same numbers as the loops, far
    faster for long T.

    Stable under strong decay: only differences of chunk-local cumulative log gates that are
    <= 0 are ever exponentiated. The working dtype and `operand_dtype` are those of
    `references.common.chunk_inputs`.
    """
    T, out_dtype = q.shape[1], q.dtype
    scale, rnd, (q, k, v, g) = chunk_inputs((q, k, v, g), scale, chunk_size, operand_dtype)
    B, H, N, C, K = q.shape
    G = torch.cumsum(g, dim=-2)            # inclusive chunk-local cumulative log gate
    G_read = G if u is None else G - g     # the gate of the state o_i reads: after step i, or before it
    G_last = G[..., -1:, :]                # [B, H, N, 1, K]

    if u is None:
        A = map_chunk_groups(lambda q, k, G: gated_scores(q, k, G, G), q, k, G,
                             elements_per_chunk=B * H * C * C * K)
        o_intra = rnd(A) @ rnd(v)
    else:
        A = map_chunk_groups(lambda q, k, G_read, G: gated_scores(q, k, G_read, G, diagonal=-1),
                             q, k, G_read, G, elements_per_chunk=B * H * C * C * K)
        bonus = torch.einsum("bhnid,hd,bhnid->bhni", q, u.to(q.dtype), k)[..., None] * v
        o_intra = rnd(A) @ rnd(v) + bonus

    # Chunk-to-chunk state: h_{n+1} = diag(exp(G_last)) h_n + (k * exp(G_last - G))^T v.
    k_to_end = k * torch.exp(G_last - G)
    increments = rnd(k_to_end).transpose(-1, -2) @ rnd(v)        # [B, H, N, K, V]
    decays = torch.exp(G_last).transpose(-1, -2)                  # [B, H, N, K, 1]
    starts, final = chunked_scan(decays, increments, initial_state)   # states entering each chunk

    o_inter = rnd(q * torch.exp(G_read)) @ rnd(starts)
    o = scale * (o_inter + o_intra)
    return chunks_to_time(o, T, out_dtype), (final if output_final_state else None)
