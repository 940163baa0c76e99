"""The gated delta rule in chunks (the WY form): S_t = exp(g_t) (I - beta_t k_t^T k_t) S_{t-1}
+ beta_t k_t^T v_t, o_t = scale q_t S_t (kernels in fla_kernels/ops/common/chunk_delta.py)."""
from __future__ import annotations

from fla_kernels.ops.common.chunk_delta import chunk_delta
from fla_kernels.ops.common.delta_call import delta_call


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, use_gate_in_kernel=False,
                           A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False):
    """The gated delta rule, chunk by chunk; arguments and results as
    `fused_recurrent_gated_delta_rule`'s (g [B, T, H] before beta, as upstream's
    chunk_gated_delta_rule takes them).

    q, k: [B, T, H, K], K at most 256 (k L2-normalised, or use_qk_l2norm_in_kernel=True to normalise q and k
    here); v: [B, T, H, V]; g: [B, T, H], one log decay <= 0 per head and step; beta: [B, T, H],
    the step size in (0, 1). One dtype (fp32, fp16 or bf16), but g and beta may be float32
    beside 16-bit q, k, v. initial_state: [B, H, K, V] float32 or None. scale defaults to
    K ** -0.5. Returns (o [B, T, H, V] in the inputs' dtype, final state [B, H, K, V] float32 or
    None); differentiable in every tensor. cu_seqlens: None, or int32 / int64 [N + 1], the
    cumulative starts of N sequences packed along T (B = 1), each run on its own: initial and
    final state [N, H, K, V].
    """
    return delta_call(chunk_delta, "chunk_gated_delta_rule", q, k, v, beta, g, "BTH", scale,
                      initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
                      use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
                      use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval)
