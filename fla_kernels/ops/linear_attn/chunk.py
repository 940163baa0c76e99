"""Linear attention, chunked: S_t = S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.

The chunked simple-GLA kernels (ops/simple_gla/chunk.py) with the gate switched off
(USE_G constexpr): intra-chunk scores (q k^T masked causally) times v, states entering
each chunk from ops/common/chunk_state.py without decay.
"""
from __future__ import annotations

from fla_kernels.ops.common.autograd import apply_checked
from fla_kernels.ops.linear_attn.normalize import normalized
from fla_kernels.ops.simple_gla.chunk import BT, SIMPLE_GLA_LAYOUTS, ChunkSimpleGLAFunction


def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                      normalize=False, cu_seqlens=None):
    """Chunked linear attention: returns (o [B, T, H, V] in the inputs' dtype, final state
    [B, H, K, V] float32 or None).

    q, k: [B, T, H, K]; v: [B, T, H, V]; one dtype (fp32, fp16 or bf16). scale defaults to
    K ** -0.5; initial_state: [B, H, K, V] float32 or None. Differentiable in q, k, v and
    initial_state. cu_seqlens: None, or int32 / int64 [N + 1], the cumulative starts of N
    sequences packed along T (B = 1), each run on its own: initial and final state [N, H, K, V].

    normalize=True divides o by the running key sum (`normalize.py`); the state is then the pair
    (S [B, H, K, V], z [B, 1, H, K]) float32, as initial_state (or S alone: z0 = 0) and as final
    state.
    """
    if normalize:
        return normalized(chunk_linear_attn, "chunk_linear_attn", q, k, v, scale, initial_state,
                          output_final_state, cu_seqlens)
    return apply_checked(ChunkSimpleGLAFunction, "chunk_linear_attn", dict(q=q, k=k, v=v, g=None),
                         SIMPLE_GLA_LAYOUTS, scale, initial_state, output_final_state,
                         optional=("g",), cu_seqlens=cu_seqlens, chunk_size=BT)
