"""Kimi delta attention, token by token: S_t = (I - beta_t k_t^T k_t) diag(exp(g_t)) S_{t-1} + beta_t k_t^T v_t,
o_t = scale q_t S_t (kernels in fla_kernels/ops/common/fused_recurrent_delta.py)."""
from __future__ import annotations

from fla_kernels.ops.common.delta_call import delta_call
from fla_kernels.ops.common.fused_recurrent_delta import fused_recurrent_delta


def fused_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False):
    """Kimi delta attention, token by token.

    q, k: [B, T, H, K], K at most 256 (k L2-normalised, or use_qk_l2norm_in_kernel=True to normalise q and k
    here); v: [B, T, H, V]; g: [B, T, H, K], log decays <= 0 per key channel, applied before the
    delta update; beta: [B, T, H], the step size in (0, 1). One dtype (fp32, fp16 or bf16), but
    g and beta may be float32 beside 16-bit q, k, v. initial_state: [B, H, K, V] float32 or
    None. scale defaults to K ** -0.5. Returns (o [B, T, H, V] in the inputs' dtype, final state
    [B, H, K, V] float32 or None); differentiable in every tensor. cu_seqlens: None, or int32 /
    int64 [N + 1], the cumulative starts of N sequences packed along T (B = 1), each run on its
    own: initial and final state [N, H, K, V].
    use_beta_sigmoid_in_kernel: beta is its logit, and the step size sigmoid(beta); with
    allow_neg_eigval too, 2 sigmoid(beta) in (0, 2); computed in float32 before the kernels.
    """
    return delta_call(fused_recurrent_delta, "fused_recurrent_kda", q, k, v, beta, g, "BTHK", scale,
                      initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
                      use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval)
