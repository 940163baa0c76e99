"""Kimi delta attention references (references/delta.py holds the family's loop and WY form).

Per (batch, head), with state S [K, V], log decays g_t [K] (<= 0, one per key channel) and
beta_t in (0, 1) per head and step:
    S_t = (I - beta_t k_t^T k_t) diag(exp(g_t)) S_{t-1} + beta_t k_t^T v_t
    o_t = scale q_t S_t
The decay acts before the delta update (the key reads the decayed state), as upstream fla's.
Both take the public signature of the kernels and are differentiable in every input, the
initial state included.
"""
from __future__ import annotations

from references.delta import call_gate_and_beta, delta_chunked, delta_recurrent


def kda_recurrent(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, **computed):
    """Token-by-token loop in the inputs' dtype (the definition); `computed`: `call_gate_and_beta`'s."""
    g, beta = call_gate_and_beta(g, beta, **computed)
    return delta_recurrent(q, k, v, beta, g, scale, initial_state, output_final_state,
                           use_qk_l2norm_in_kernel)


def kda_chunked(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, chunk_size=16, operand_dtype=None, **computed):
    """The WY chunked form; `operand_dtype` rounds matrix-product operands (the same-dtype baseline)."""
    g, beta = call_gate_and_beta(g, beta, **computed)
    return delta_chunked(q, k, v, beta, g, scale, initial_state, output_final_state,
                         use_qk_l2norm_in_kernel, chunk_size, operand_dtype)
