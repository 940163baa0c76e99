"""GatedSlotAttention: M slots per head with log gate g = logsigmoid(W_f x) / normaliser and slot
writes s = 1 - exp(g), over our gsa kernels; the state is the pair (hk, hv)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fla_kernels.layers.base import RecurrentAttention
from fla_kernels.ops.gsa import chunk_gsa, fused_recurrent_gsa


class GatedSlotAttention(RecurrentAttention):
    MODES = {"chunk": chunk_gsa, "fused_recurrent": fused_recurrent_gsa}

    def __init__(self, hidden_size: int = 256, num_heads: int = 4, num_slots: int = 64,
                 expand_k: float = 1.0, expand_v: float = 1.0, gate_logit_normalizer: float = 8.0,
                 mode: str = "chunk", layer_idx: int | None = None):
        super().__init__(hidden_size, num_heads, expand_k, expand_v, mode, layer_idx)
        self.num_slots, self.gate_logit_normalizer = num_slots, gate_logit_normalizer
        self.f_proj = nn.Linear(hidden_size, num_heads * num_slots, bias=False)

    def kernel_inputs(self, x):
        g = self.heads(F.logsigmoid(self.f_proj(x)) / self.gate_logit_normalizer, self.num_slots)
        s = 1 - torch.exp(g)
        return (self.heads(self.q_proj(x), self.head_k_dim), self.heads(self.k_proj(x), self.head_k_dim),
                self.heads(self.v_proj(x), self.head_v_dim), s, g)

    def state_shapes(self):
        return [(self.num_heads, self.head_k_dim, self.num_slots),
                (self.num_heads, self.num_slots, self.head_v_dim)]
