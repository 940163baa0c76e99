"""Simple GLA, token by token: S_t = exp(g_t) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.

A thin public function on the shared kernels of fla_kernels/ops/common/fused_recurrent.py
(scalar gate mode, or no gate when g is None; g_gamma stands for g).
"""
from __future__ import annotations

from fla_kernels.ops.common.fused_recurrent import fused_recurrent
from fla_kernels.ops.simple_gla.chunk import decay_gate


def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                               output_final_state=False, cu_seqlens=None):
    """Simple gated linear attention, token by token.

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] (one log decay <= 0 per head and
    step) or None (no decay: plain linear attention; its gradient is then None). One
    dtype (fp32, fp16 or bf16), but g may be float32 beside 16-bit q, k, v. g_gamma: [H],
    a constant log decay per head in place of g (not both); its gradient is None
    (`decay_gate`). initial_state: [B, H, K, V] float32 or None. scale defaults to
    K ** -0.5. Returns (o [B, T, H, V] in the inputs' dtype, final state [B, H, K, V]
    float32 or None); differentiable in every other tensor. cu_seqlens: None, or int32 /
    int64 [N + 1], the cumulative starts of N sequences packed along T (B = 1), each run on
    its own: initial and final state [N, H, K, V].
    """
    g, sizes = decay_gate("fused_recurrent_simple_gla", q, k, v, g, g_gamma, initial_state,
                          cu_seqlens)
    return fused_recurrent(q, k, v, g, scale, initial_state, output_final_state,
                           cu_seqlens=sizes.get("cu_seqlens"))
