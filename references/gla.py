"""GLA (gated linear attention) references: the recurrent loop (the definition) and a chunked form.

Per (batch, head), with state S of shape [K, V]:
    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t
    o_t = scale * q_t S_t            (the output reads the state including step t)
Both functions take and return the public signature of the kernels and are
differentiable in every input, the initial state included.
"""
from __future__ import annotations

import torch

from references.chunk_gated import chunk_gated
from references.common import default_scale, recurrent_loop, start_state


def gla_recurrent(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """Token-by-token loop in the inputs' dtype; autograd through it is linear in T."""
    B, T, H, K = q.shape
    scale = default_scale(K, scale)

    def step(state, q_t, k_t, v_t, g_t):
        state = torch.exp(g_t)[..., None] * state + k_t[..., :, None] * v_t[..., None, :]
        return state, scale * torch.einsum("bhk,bhkv->bhv", q_t, state)

    o, state = recurrent_loop(step, start_state(initial_state, q, (B, H, K, v.shape[-1])), q, k, v, g)
    return o, (state if output_final_state else None)


def gla_chunked(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                chunk_size=16, operand_dtype=None):
    """Chunked form: the same numbers as the loop, far faster for long T (see
    `references.chunk_gated.chunk_gated`); `operand_dtype` rounds matrix-product operands."""
    return chunk_gated(q, k, v, g, None, scale, initial_state, output_final_state, chunk_size, operand_dtype)
