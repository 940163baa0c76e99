"""RWKV6, token by token: S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t,
o_t = scale * r_t (S_{t-1} + diag(u) k_t^T v_t).

A thin public function on the shared kernels of fla_kernels/ops/common/fused_recurrent.py
(per-channel gate, READS_PREVIOUS with the bonus u); its docstring derives the gate gradient.
"""
from __future__ import annotations

from fla_kernels.ops.common.fused_recurrent import fused_recurrent
from fla_kernels.utils import check_inputs


def fused_recurrent_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                          cu_seqlens=None):
    """RWKV6 attention, token by token.

    r, k, w: [B, T, H, K]; v: [B, T, H, V]; u: [H, K]; one dtype (fp32, fp16 or
    bf16); w is the log decay (<= 0). initial_state: [B, H, K, V] float32 or None.
    scale defaults to K ** -0.5. Returns (o [B, T, H, V] in the inputs' dtype,
    final state [B, H, K, V] float32 or None); differentiable in every tensor.
    cu_seqlens: None, or int32 / int64 [N + 1], the cumulative starts of N sequences packed
    along T (B = 1), each run on its own (u shared): initial and final state [N, H, K, V].
    """
    sizes = check_inputs("fused_recurrent_rwkv6", dict(r=r, k=k, v=v, w=w, u=u),
                         dict(r="BTHK", k="BTHK", v="BTHV", w="BTHK", u="HK"),
                         initial_state=initial_state, cu_seqlens=cu_seqlens)
    return fused_recurrent(r, k, v, w, scale, initial_state, output_final_state, u=u,
                           cu_seqlens=sizes.get("cu_seqlens"))
