"""Kimi delta attention in chunks (the WY form): S_t = (I - beta_t k_t^T k_t) diag(exp(g_t)) S_{t-1}
+ beta_t k_t^T v_t, o_t = scale q_t S_t (kernels in fla_kernels/ops/common/chunk_delta.py, the pair
matrices of a gate per key channel in chunk_pairs.py)."""
from __future__ import annotations

from fla_kernels.ops.common.chunk_delta import chunk_delta
from fla_kernels.ops.common.delta_call import delta_call


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None,
              use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False):
    """Kimi delta attention, chunk by chunk; arguments and results as `fused_recurrent_kda`'s
    (g [B, T, H, K], log decays <= 0 per key channel, before beta)."""
    return delta_call(chunk_delta, "chunk_kda", q, k, v, beta, g, "BTHK", scale, initial_state,
                      output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
                      use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval)
