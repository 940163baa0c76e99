"""Linear attention references: simple GLA without a gate, and its normalised form.

Per (batch, head), with state S of shape [K, V]:
    S_t = S_{t-1} + k_t^T v_t
    o_t = scale * q_t S_t
normalize=True divides by the running key sum z_t = z0 + sum_{s <= t} k_s:
    o_t = (scale * q_t S_t) / (scale * q_t . z_t + 1e-10)
and the state is the pair (S [B, H, K, V], z [B, 1, H, K]), as initial state (or S alone, z0 = 0)
and as final state.
"""
from __future__ import annotations

import torch

from references.common import (default_scale, operand_rounding, recurrent_loop, start_state,
                               work_dtype_of)
from references.simple_gla import simple_gla_chunked, simple_gla_recurrent

EPS = 1e-10  # keeps the denominator off zero, as upstream adds it


def split_state(initial_state):
    """(S0, z0) of a normalised call's initial state: None, the pair, or S alone (z0 None)."""
    if isinstance(initial_state, (tuple, list)):
        return tuple(initial_state)
    return initial_state, None


def linear_attn_recurrent(q, k, v, scale=None, initial_state=None, output_final_state=False,
                          normalize=False):
    """Token-by-token loop in the inputs' dtype (the definition); with normalize the loop carries
    the key sum beside the state."""
    if not normalize:
        return simple_gla_recurrent(q, k, v, None, None, scale, initial_state, output_final_state)
    B, T, H, K = q.shape
    scale = default_scale(K, scale)
    h0, z0 = split_state(initial_state)
    states = (start_state(h0, q, (B, H, K, v.shape[-1])), start_state(z0, q, (B, 1, H, K))[:, 0])

    def step(states, q_t, k_t, v_t):
        S, z = states
        S = S + k_t[..., :, None] * v_t[..., None, :]
        z = z + k_t
        o_t = scale * torch.einsum("bhk,bhkv->bhv", q_t, S)
        return (S, z), o_t / (scale * (q_t * z).sum(-1, keepdim=True) + EPS)

    o, (S, z) = recurrent_loop(step, states, q, k, v)
    return o, ((S, z[:, None]) if output_final_state else None)


def linear_attn_chunked(q, k, v, scale=None, initial_state=None, output_final_state=False,
                        chunk_size=16, operand_dtype=None, normalize=False):
    """Chunked form (see `simple_gla_chunked`); operand_dtype rounds matrix-product operands, and
    with normalize those of the denominator's row dot q . z, whose key sums stay in the working
    dtype."""
    h0, z0 = split_state(initial_state) if normalize else (initial_state, None)
    o, ht = simple_gla_chunked(q, k, v, None, None, scale, h0, output_final_state,
                               chunk_size=chunk_size, operand_dtype=operand_dtype)
    if not normalize:
        return o, ht
    wd, rnd = work_dtype_of(q.dtype), operand_rounding(operand_dtype)
    z = torch.cumsum(k.to(wd), dim=1)
    z = z if z0 is None else z + z0.to(wd)
    d = default_scale(q.shape[-1], scale) * (rnd(q.to(wd)) * rnd(z)).sum(-1, keepdim=True) + EPS
    o = (o.to(wd) / d).to(q.dtype)
    return o, ((ht, z[:, -1:]) if output_final_state else None)
