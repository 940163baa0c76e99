"""LinearAttention: o_t = scale q_t S_t, S_t = S_{t-1} + k_t^T v_t, over our linear_attn kernels."""
from __future__ import annotations

import torch.nn as nn

from fla_kernels.layers.base import RecurrentAttention
from fla_kernels.ops.linear_attn import (chunk_linear_attn, fused_chunk_linear_attn,
                                         fused_recurrent_linear_attn)


class LinearAttention(RecurrentAttention):
    MODES = {"chunk": chunk_linear_attn, "fused_chunk": fused_chunk_linear_attn,
             "fused_recurrent": fused_recurrent_linear_attn}

    def __init__(self, hidden_size: int = 256, num_heads: int = 4, expand_k: float = 1.0,
                 expand_v: float = 1.0, mode: str = "chunk", layer_idx: int | None = None):
        key_dim, value_dim = round(hidden_size * expand_k), round(hidden_size * expand_v)
        super().__init__(hidden_size, num_heads, key_dim // num_heads, value_dim // num_heads, mode,
                         layer_idx)
        self.q_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, value_dim, bias=False)

    def kernel_inputs(self, x):
        return (self.heads(self.q_proj(x), self.head_k_dim), self.heads(self.k_proj(x), self.head_k_dim),
                self.heads(self.v_proj(x), self.head_v_dim))

    def state_shapes(self):
        return [(self.num_heads, self.head_k_dim, self.head_v_dim)]
