"""GLA, token by token: S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.

A thin public function on the shared kernels of fla_kernels/ops/common/fused_recurrent.py
(per-channel gate mode); its docstring derives the gate gradient.
"""
from __future__ import annotations

from fla_kernels.ops.common.fused_recurrent import fused_recurrent
from fla_kernels.ops.gla.chunk import GLA_LAYOUTS
from fla_kernels.utils import check_inputs


def fused_recurrent_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                        cu_seqlens=None):
    """Gated linear attention, token by token.

    q, k, g: [B, T, H, K]; v: [B, T, H, V]; one dtype (fp32, fp16 or bf16); g is the
    per-channel log decay (<= 0). initial_state: [B, H, K, V] float32 or None. scale
    defaults to K ** -0.5. Returns (o [B, T, H, V] in the inputs' dtype, final state
    [B, H, K, V] float32 or None); differentiable in every tensor. cu_seqlens: None, or int32 / int64 [N + 1], the cumulative starts of N
    sequences packed along T (B = 1), each run on its own: initial and final state [N, H, K, V].
    """
    sizes = check_inputs("fused_recurrent_gla", dict(q=q, k=k, v=v, g=g), GLA_LAYOUTS,
                         initial_state=initial_state, cu_seqlens=cu_seqlens)
    return fused_recurrent(q, k, v, g, scale, initial_state, output_final_state,
                           cu_seqlens=sizes.get("cu_seqlens"))
