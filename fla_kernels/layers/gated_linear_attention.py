"""GatedLinearAttention: per-channel log gate logsigmoid(W_g x) / normaliser, output gated by
silu(W_o' x), over our gla kernels."""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from fla_kernels.layers.base import RecurrentAttention
from fla_kernels.ops.gla import chunk_gla, fused_chunk_gla, fused_recurrent_gla


class GatedLinearAttention(RecurrentAttention):
    MODES = {"chunk": chunk_gla, "fused_chunk": fused_chunk_gla, "fused_recurrent": fused_recurrent_gla}

    def __init__(self, hidden_size: int = 256, num_heads: int = 4, expand_k: float = 0.5,
                 expand_v: float = 1.0, gate_logit_normalizer: float = 16.0, mode: str = "chunk",
                 layer_idx: int | None = None):
        super().__init__(hidden_size, num_heads, expand_k, expand_v, mode, layer_idx)
        self.gate_logit_normalizer = gate_logit_normalizer
        self.gk_proj = nn.Linear(hidden_size, self.key_dim, bias=True)
        self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False)

    def kernel_inputs(self, x):
        gk = F.logsigmoid(self.gk_proj(x)) / self.gate_logit_normalizer
        return (self.heads(self.q_proj(x), self.head_k_dim), self.heads(self.k_proj(x), self.head_k_dim),
                self.heads(self.v_proj(x), self.head_v_dim), self.heads(gk, self.head_k_dim))

    def output_gate(self, x):
        return F.silu(self.g_proj(x))

    def state_shapes(self):
        return [(self.num_heads, self.head_k_dim, self.head_v_dim)]
