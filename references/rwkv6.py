"""RWKV6 references: the recurrent loop (the definition) and a chunked form.

Per (batch, head), with state S of shape [K, V]:
    o_t = scale * r_t (S_{t-1} + diag(u) k_t^T v_t)
    S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t
Both functions take and return the public signature of the kernels and are
differentiable in every input, the initial state included.
"""
from __future__ import annotations

import torch

from references.common import chunked_scan, map_chunk_groups, pad_time, round_to, work_dtype_of


def rwkv6_recurrent(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False):
    """Token-by-token loop in the inputs' dtype; autograd through it is linear in T."""
    B, T, H, K = r.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    if initial_state is None:
        state = r.new_zeros(B, H, K, V)
    else:
        state = initial_state.to(r.dtype)
    bonus = u.to(r.dtype)[None, :, :, None]
    outputs = []
    for r_t, k_t, v_t, w_t in zip(r.unbind(1), k.unbind(1), v.unbind(1), w.unbind(1)):
        kv = k_t[..., :, None] * v_t[..., None, :]
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", r_t, state + bonus * kv))
        state = torch.exp(w_t)[..., None] * state + kv
    o = torch.stack(outputs, dim=1)
    return o, (state if output_final_state else None)


def rwkv6_chunked(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                  chunk_size=16, operand_dtype=None):
    """Chunked form: the same numbers as the loop, far faster for long T.

    Stable under strong decay: only differences of chunk-local cumulative log
    gates that are <= 0 are ever exponentiated. `operand_dtype` rounds the
    operands of every matrix product to that dtype (bf16 / fp16) while gates,
    exponentials, accumulations and the carried state stay in the working
    dtype (float64 for float64 inputs, float32 otherwise): the arithmetic of a
    straightforward production kernel in that dtype.
    """
    B, T, H, K = r.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    out_dtype = r.dtype
    wd = work_dtype_of(r.dtype)
    rnd = (lambda x: round_to(x, operand_dtype)) if operand_dtype is not None else (lambda x: x)
    C = chunk_size
    # [B, H, N, C, D] views, zero-padded at the end: a zero gate with zero k, v leaves the state as is.
    r, k, v, w = (pad_time(x.to(wd), C) for x in (r, k, v, w))
    N = r.shape[2]
    G = torch.cumsum(w, dim=-2)            # inclusive chunk-local cumulative log gate
    G_prev = G - w                         # gate accumulated before step i (exclusive)
    G_last = G[..., -1:, :]                # [B, H, N, 1, K]

    A = map_chunk_groups(_intra_scores, r, k, G_prev, G, elements_per_chunk=B * H * C * C * K)
    bonus = torch.einsum("bhnid,hd,bhnid->bhni", r, u.to(wd), k)[..., None] * v
    o_intra = rnd(A) @ rnd(v) + bonus

    # Chunk-to-chunk state: h_{n+1} = diag(exp(G_last)) h_n + (k * exp(G_last - G))^T v.
    k_to_end = k * torch.exp(G_last - G)
    increments = rnd(k_to_end).transpose(-1, -2) @ rnd(v)        # [B, H, N, K, V]
    decays = torch.exp(G_last).transpose(-1, -2)                  # [B, H, N, K, 1]
    h0 = None if initial_state is None else initial_state.to(wd)
    starts, final = chunked_scan(decays, increments, h0)          # states entering each chunk

    o_inter = rnd(r * torch.exp(G_prev)) @ rnd(starts)
    o = scale * (o_inter + o_intra)
    o = o.permute(0, 2, 3, 1, 4).reshape(B, N * C, H, V)[:, :T]
    return o.to(out_dtype), (final if output_final_state else None)


def _intra_scores(r, k, G_prev, G):
    """A_ij = sum_d r_id k_jd exp(G_prev_id - G_jd) for j < i, else 0; [..., C, D] -> [..., C, C]."""
    C = r.shape[-2]
    strictly_lower = torch.ones(C, C, dtype=torch.bool, device=r.device).tril(-1)
    diff = G_prev[..., :, None, :] - G[..., None, :, :]
    diff = diff.masked_fill(~strictly_lower[..., None], float("-inf"))
    return (r[..., :, None, :] * k[..., None, :, :] * torch.exp(diff)).sum(-1)
