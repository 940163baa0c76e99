"""Simple GLA, token by token: S_t = exp(g_t) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.

A thin public function on the shared kernels of fla_kernels/ops/common/fused_recurrent.py
(scalar gate mode, or no gate when g is None).
"""
from __future__ import annotations

import torch

from fla_kernels.ops.common.fused_recurrent import fused_recurrent
from fla_kernels.utils import check_inputs


def fused_recurrent_simple_gla(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False):
    """Simple gated linear attention, token by token.

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] (one log decay <= 0 per head and
    step) or None (no decay: plain linear attention; its gradient is then None). One
    dtype (fp32, fp16 or bf16). initial_state: [B, H, K, V] float32 or None. scale
    defaults to K ** -0.5. Returns (o [B, T, H, V] in the inputs' dtype, final state
    [B, H, K, V] float32 or None); differentiable in every tensor.
    """
    if not all(isinstance(x, torch.Tensor) and x.dim() == 4 for x in (q, k, v)):
        raise ValueError("fused_recurrent_simple_gla: q, k, v must be 4-D [B, T, H, *] tensors.")
    if g is not None and not (isinstance(g, torch.Tensor) and g.dim() == 3):
        raise ValueError("fused_recurrent_simple_gla: g must be a 3-D [B, T, H] tensor or None.")
    B, T, H, K = q.shape
    V = v.shape[-1]
    tensors = {"q": q, "k": k, "v": v}
    shapes = {"q": (B, T, H, K), "k": (B, T, H, K), "v": (B, T, H, V), "g": (B, T, H)}
    if g is not None:
        tensors["g"] = g
    check_inputs("fused_recurrent_simple_gla", tensors, shapes,
                 initial_state=initial_state, state_shape=(B, H, K, V))
    return fused_recurrent(q, k, v, g, scale, initial_state, output_final_state)
