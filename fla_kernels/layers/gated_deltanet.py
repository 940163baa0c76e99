"""GatedDeltaNet: the gated delta rule with one decay per head and step,
g = -exp(A_log) * softplus(W_a x + dt_bias), and the output gated by silu(W_g x), over our
gated_delta_rule kernels (fla_kernels/layers/delta_layer.py)."""
from __future__ import annotations

import torch.nn as nn

from fla_kernels.layers.delta_layer import DeltaLayer, decay, decay_parameters
from fla_kernels.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


class GatedDeltaNet(DeltaLayer):
    MODES = {"chunk": chunk_gated_delta_rule, "fused_recurrent": fused_recurrent_gated_delta_rule}

    def __init__(self, hidden_size: int = 256, num_heads: int = 4, expand_k: float = 0.75,
                 expand_v: float = 1.5, mode: str = "chunk", layer_idx: int | None = None, **options):
        """options: DeltaLayer's (use_short_conv, conv_size, allow_neg_eigval, norm_eps)."""
        super().__init__(hidden_size, num_heads, expand_k, expand_v, mode, layer_idx, **options)
        self.a_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.A_log, self.dt_bias = decay_parameters(num_heads)
        self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False)

    def delta_inputs(self, x, q, k, v, beta):
        return q, k, v, decay(self.A_log, self.a_proj(x), self.dt_bias), beta

    def output_gate(self, x):
        return self.g_proj(x)
