"""KimiDeltaAttention: the delta rule with a decay per key channel,
g = -exp(A_log[head]) * softplus(W_f2 W_f1 x + dt_bias) (a low-rank projection), and the output
gated by sigmoid(W_g2 W_g1 x + b), over our kda kernels (fla_kernels/layers/delta_layer.py)."""
from __future__ import annotations

import torch
import torch.nn as nn

from fla_kernels.layers.delta_layer import DeltaLayer, decay, decay_parameters
from fla_kernels.ops.kda import chunk_kda, fused_recurrent_kda


class KimiDeltaAttention(DeltaLayer):
    MODES = {"chunk": chunk_kda, "fused_recurrent": fused_recurrent_kda}
    GATE_ACTIVATION = staticmethod(torch.sigmoid)

    def __init__(self, hidden_size: int = 256, num_heads: int = 4, expand_k: float = 1.0,
                 expand_v: float = 1.0, mode: str = "chunk", layer_idx: int | None = None,
                 **options):
        """options: DeltaLayer's (use_short_conv, conv_size, allow_neg_eigval, norm_eps)."""
        super().__init__(hidden_size, num_heads, expand_k, expand_v, mode, layer_idx, **options)
        rank = self.head_v_dim
        self.f_proj = nn.Sequential(nn.Linear(hidden_size, rank, bias=False),
                                    nn.Linear(rank, self.key_dim, bias=False))
        self.A_log, _ = decay_parameters(num_heads)
        _, self.dt_bias = decay_parameters(self.key_dim)
        self.g_proj = nn.Sequential(nn.Linear(hidden_size, rank, bias=False),
                                    nn.Linear(rank, self.value_dim, bias=True))

    def delta_inputs(self, x, q, k, v, beta):
        logits = self.heads(self.f_proj(x), self.head_k_dim)
        return q, k, v, decay(self.A_log[:, None], logits, self.heads(self.dt_bias, self.head_k_dim)), beta

    def output_gate(self, x):
        return self.g_proj(x)
