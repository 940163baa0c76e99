"""Linear attention, token by token: S_t = S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.

A thin public function on the shared kernels of fla_kernels/ops/common/fused_recurrent.py
(no gate).
"""
from __future__ import annotations

from fla_kernels.ops.common.fused_recurrent import fused_recurrent
from fla_kernels.ops.linear_attn.normalize import normalized
from fla_kernels.utils import check_inputs


def fused_recurrent_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                                normalize=False, cu_seqlens=None):
    """Linear attention, token by token.

    q, k: [B, T, H, K]; v: [B, T, H, V]; one dtype (fp32, fp16 or bf16).
    initial_state: [B, H, K, V] float32 or None. scale defaults to K ** -0.5. Returns
    (o [B, T, H, V] in the inputs' dtype, final state [B, H, K, V] float32 or None);
    differentiable in every tensor. cu_seqlens: None, or int32 / int64 [N + 1], the cumulative
    starts of N sequences packed along T (B = 1), each run on its own: initial and final state
    [N, H, K, V].

    normalize=True divides o by the running key sum (`normalize.py`); the state is then the pair
    (S [B, H, K, V], z [B, 1, H, K]) float32, as initial_state (or S alone: z0 = 0) and as final
    state.
    """
    if normalize:
        return normalized(fused_recurrent_linear_attn, "fused_recurrent_linear_attn", q, k, v,
                          scale, initial_state, output_final_state, cu_seqlens)
    sizes = check_inputs("fused_recurrent_linear_attn", dict(q=q, k=k, v=v),
                         dict(q="BTHK", k="BTHK", v="BTHV"), initial_state=initial_state,
                         cu_seqlens=cu_seqlens)
    return fused_recurrent(q, k, v, None, scale, initial_state, output_final_state,
                           cu_seqlens=sizes.get("cu_seqlens"))
