"""Linear attention, token by token: S_t = S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.

A thin public function on the shared kernels of fla_kernels/ops/common/fused_recurrent.py
(no gate).
"""
from __future__ import annotations

import torch

from fla_kernels.ops.common.fused_recurrent import fused_recurrent
from fla_kernels.utils import check_inputs


def fused_recurrent_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False):
    """Linear attention, token by token.

    q, k: [B, T, H, K]; v: [B, T, H, V]; one dtype (fp32, fp16 or bf16).
    initial_state: [B, H, K, V] float32 or None. scale defaults to K ** -0.5. Returns
    (o [B, T, H, V] in the inputs' dtype, final state [B, H, K, V] float32 or None);
    differentiable in every tensor.
    """
    if not all(isinstance(x, torch.Tensor) and x.dim() == 4 for x in (q, k, v)):
        raise ValueError("fused_recurrent_linear_attn: q, k, v must be 4-D [B, T, H, *] tensors.")
    B, T, H, K = q.shape
    V = v.shape[-1]
    check_inputs("fused_recurrent_linear_attn", {"q": q, "k": k, "v": v},
                 {"q": (B, T, H, K), "k": (B, T, H, K), "v": (B, T, H, V)},
                 initial_state=initial_state, state_shape=(B, H, K, V))
    return fused_recurrent(q, k, v, None, scale, initial_state, output_final_state)
