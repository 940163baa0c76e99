"""RWKV6, token by token: S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t,
o_t = scale * r_t (S_{t-1} + diag(u) k_t^T v_t).

A thin public function on the shared kernels of fla_kernels/ops/common/fused_recurrent.py
(per-channel gate, READS_PREVIOUS with the bonus u); its docstring derives the gate gradient.
"""
from __future__ import annotations

import torch

from fla_kernels.ops.common.fused_recurrent import fused_recurrent
from fla_kernels.utils import check_inputs


def fused_recurrent_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False):
    """RWKV6 attention, token by token.

    r, k, w: [B, T, H, K]; v: [B, T, H, V]; u: [H, K]; one dtype (fp32, fp16 or
    bf16); w is the log decay (<= 0). initial_state: [B, H, K, V] float32 or None.
    scale defaults to K ** -0.5. Returns (o [B, T, H, V] in the inputs' dtype,
    final state [B, H, K, V] float32 or None); differentiable in every tensor.
    """
    if not all(isinstance(x, torch.Tensor) and x.dim() == n
               for x, n in ((r, 4), (k, 4), (v, 4), (w, 4), (u, 2))):
        raise ValueError("fused_recurrent_rwkv6: r, k, v, w must be 4-D [B, T, H, *] tensors "
                         "and u a 2-D [H, K] tensor.")
    B, T, H, K = r.shape
    V = v.shape[-1]
    check_inputs("fused_recurrent_rwkv6",
                 {"r": r, "k": k, "v": v, "w": w, "u": u},
                 {"r": (B, T, H, K), "k": (B, T, H, K), "v": (B, T, H, V), "w": (B, T, H, K),
                  "u": (H, K)},
                 initial_state=initial_state, state_shape=(B, H, K, V))
    return fused_recurrent(r, k, v, w, scale, initial_state, output_final_state, u=u)
