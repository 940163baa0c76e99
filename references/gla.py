"""GLA (gated linear attention) references: the recurrent loop (the definition) and a chunked form.

Per (batch, head), with state S of shape [K, V]:
    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t
    o_t = scale * q_t S_t            (the output reads the state including step t)
Both functions take and return the public signature of the kernels and are
differentiable in every input, the initial state included.
"""
from __future__ import annotations

import torch

from references.common import chunked_scan, map_chunk_groups, pad_time, round_to, work_dtype_of


def gla_recurrent(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """Token-by-token loop in the inputs' dtype; autograd through it is linear in T."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    if initial_state is None:
        state = q.new_zeros(B, H, K, V)
    else:
        state = initial_state.to(q.dtype)
    outputs = []
    for q_t, k_t, v_t, g_t in zip(q.unbind(1), k.unbind(1), v.unbind(1), g.unbind(1)):
        state = torch.exp(g_t)[..., None] * state + k_t[..., :, None] * v_t[..., None, :]
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", q_t, state))
    o = torch.stack(outputs, dim=1)
    return o, (state if output_final_state else None)


def gla_chunked(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                chunk_size=16, operand_dtype=None):
    """Chunked form: the same numbers as the loop, far faster for long T.

    Stable under strong decay: only differences of chunk-local cumulative log
    gates that are <= 0 are ever exponentiated. `operand_dtype` rounds the
    operands of every matrix product to that dtype (bf16 / fp16) while gates,
    exponentials, accumulations and the carried state stay in the working
    dtype (float64 for float64 inputs, float32 otherwise): the arithmetic of a
    straightforward production kernel in that dtype.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    out_dtype = q.dtype
    wd = work_dtype_of(q.dtype)
    rnd = (lambda x: round_to(x, operand_dtype)) if operand_dtype is not None else (lambda x: x)
    C = chunk_size
    # [B, H, N, C, D] views, zero-padded at the end: a zero gate with zero k, v leaves the state as is.
    q, k, v, g = (pad_time(x.to(wd), C) for x in (q, k, v, g))
    G = torch.cumsum(g, dim=-2)            # inclusive chunk-local cumulative log gate
    G_last = G[..., -1:, :]                # [B, H, N, 1, K]

    A = map_chunk_groups(_intra_scores, q, k, G, elements_per_chunk=B * H * C * C * K)
    o_intra = rnd(A) @ rnd(v)

    # Chunk-to-chunk state: h_{n+1} = diag(exp(G_last)) h_n + (k * exp(G_last - G))^T v.
    k_to_end = k * torch.exp(G_last - G)
    increments = rnd(k_to_end).transpose(-1, -2) @ rnd(v)        # [B, H, N, K, V]
    decays = torch.exp(G_last).transpose(-1, -2)                  # [B, H, N, K, 1]
    h0 = None if initial_state is None else initial_state.to(wd)
    starts, final = chunked_scan(decays, increments, h0)          # states entering each chunk

    o_inter = rnd(q * torch.exp(G)) @ rnd(starts)
    o = scale * (o_inter + o_intra)
    N = q.shape[2]
    o = o.permute(0, 2, 3, 1, 4).reshape(B, N * C, H, V)[:, :T]
    return o.to(out_dtype), (final if output_final_state else None)


def _intra_scores(q, k, G):
    """A_ij = sum_d q_id k_jd exp(G_id - G_jd) for j <= i, else 0; [..., C, D] -> [..., C, C]."""
    C = q.shape[-2]
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    diff = G[..., :, None, :] - G[..., None, :, :]
    diff = diff.masked_fill(~lower[..., None], float("-inf"))
    return (q[..., :, None, :] * k[..., None, :, :] * torch.exp(diff)).sum(-1)
