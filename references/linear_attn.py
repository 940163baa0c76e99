"""Linear attention references: simple GLA without a gate.

Per (batch, head), with state S of shape [K, V]:
    S_t = S_{t-1} + k_t^T v_t
    o_t = scale * q_t S_t
"""
from __future__ import annotations

from references.simple_gla import simple_gla_chunked, simple_gla_recurrent


def linear_attn_recurrent(q, k, v, scale=None, initial_state=None, output_final_state=False):
    """Token-by-token loop in the inputs' dtype (the definition)."""
    return simple_gla_recurrent(q, k, v, None, None, scale, initial_state, output_final_state)


def linear_attn_chunked(q, k, v, scale=None, initial_state=None, output_final_state=False,
                        chunk_size=16, operand_dtype=None):
    """Chunked form (see `simple_gla_chunked`); operand_dtype rounds matrix-product operands."""
    return simple_gla_chunked(q, k, v, None, None, scale, initial_state, output_final_state,
                              chunk_size=chunk_size, operand_dtype=operand_dtype)
