"""RWKV6Attention: receptance r, log decay w = -exp(W_w x), bonus u per head, output gated by
silu(W_g x), over our rwkv6 kernels."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fla_kernels.layers.base import RecurrentAttention
from fla_kernels.ops.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6


class RWKV6Attention(RecurrentAttention):
    MODES = {"chunk": chunk_rwkv6, "fused_recurrent": fused_recurrent_rwkv6}

    def __init__(self, hidden_size: int = 256, num_heads: int = 4, expand_k: float = 0.5,
                 expand_v: float = 1.0, mode: str = "chunk", layer_idx: int | None = None):
        super().__init__(hidden_size, num_heads, expand_k, expand_v, mode, layer_idx, query="r")
        self.w_proj = nn.Linear(hidden_size, self.key_dim, bias=True)
        self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.bonus = nn.Parameter(torch.randn(num_heads, self.head_k_dim) * 0.1)

    def kernel_inputs(self, x):
        w = -torch.exp(self.w_proj(x).float().clamp(max=4.0)).to(x.dtype)
        return (self.heads(self.r_proj(x), self.head_k_dim), self.heads(self.k_proj(x), self.head_k_dim),
                self.heads(self.v_proj(x), self.head_v_dim), self.heads(w, self.head_k_dim),
                self.bonus.to(x.dtype))

    def output_gate(self, x):
        return F.silu(self.g_proj(x))

    def state_shapes(self):
        return [(self.num_heads, self.head_k_dim, self.head_v_dim)]
