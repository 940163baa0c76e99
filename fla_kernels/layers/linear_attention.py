"""LinearAttention: o_t = scale q_t S_t, S_t = S_{t-1} + k_t^T v_t, over our linear_attn kernels;
with normalize, o_t divided by scale q_t . z_t (z_t the running key sum)."""
from __future__ import annotations

import functools

from fla_kernels.layers.base import RecurrentAttention
from fla_kernels.ops.linear_attn import (chunk_linear_attn, fused_chunk_linear_attn,
                                         fused_recurrent_linear_attn)


class LinearAttention(RecurrentAttention):
    MODES = {"chunk": chunk_linear_attn, "fused_chunk": fused_chunk_linear_attn,
             "fused_recurrent": fused_recurrent_linear_attn}

    def __init__(self, hidden_size: int = 256, num_heads: int = 4, expand_k: float = 1.0,
                 expand_v: float = 1.0, mode: str = "chunk", layer_idx: int | None = None,
                 normalize: bool = False):
        """normalize: the kernels' normalize=True; the state is then the pair (S, z). The
        denominator is a sum of q_t . k_s: it suits queries and keys that stay positive."""
        super().__init__(hidden_size, num_heads, expand_k, expand_v, mode, layer_idx)
        self.normalize = normalize
        if normalize:
            self.kernel = functools.partial(self.kernel, normalize=True)

    def kernel_inputs(self, x):
        return (self.heads(self.q_proj(x), self.head_k_dim), self.heads(self.k_proj(x), self.head_k_dim),
                self.heads(self.v_proj(x), self.head_v_dim))

    def state_shapes(self):
        kv = (self.num_heads, self.head_k_dim, self.head_v_dim)
        return [kv, (1, self.num_heads, self.head_k_dim)] if self.normalize else [kv]
