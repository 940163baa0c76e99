"""RWKV6 references: the recurrent loop (the definition) and a chunked form.

Per (batch, head), with state S of shape [K, V]:
    o_t = scale * r_t (S_{t-1} + diag(u) k_t^T v_t)
    S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t
Both functions take and return the public signature of the kernels and are
differentiable in every input, the initial state included.
"""
from __future__ import annotations

import torch

from references.chunk_gated import chunk_gated
from references.common import default_scale, recurrent_loop, start_state


def rwkv6_recurrent(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False):
    """Token-by-token loop in the inputs' dtype; autograd through it is linear in T."""
    B, T, H, K = r.shape
    scale = default_scale(K, scale)
    state = start_state(initial_state, r, (B, H, K, v.shape[-1]))
    bonus = u.to(r.dtype)[None, :, :, None]

    def step(state, r_t, k_t, v_t, w_t):
        kv = k_t[..., :, None] * v_t[..., None, :]
        o_t = scale * torch.einsum("bhk,bhkv->bhv", r_t, state + bonus * kv)
        return torch.exp(w_t)[..., None] * state + kv, o_t

    o, state = recurrent_loop(step, state, r, k, v, w)
    return o, (state if output_final_state else None)


def rwkv6_chunked(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                  chunk_size=16, operand_dtype=None):
    """Chunked form: the same numbers as the loop, far faster for long T (see
    `references.chunk_gated.chunk_gated`); `operand_dtype` rounds matrix-product operands."""
    return chunk_gated(r, k, v, w, u, scale, initial_state, output_final_state, chunk_size, operand_dtype)
