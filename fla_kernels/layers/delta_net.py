"""DeltaNet: the delta rule over our delta_rule kernels (fla_kernels/layers/delta_layer.py)."""
from __future__ import annotations

from fla_kernels.layers.delta_layer import DeltaLayer
from fla_kernels.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule


class DeltaNet(DeltaLayer):
    MODES = {"chunk": chunk_delta_rule, "fused_recurrent": fused_recurrent_delta_rule}

    def __init__(self, hidden_size: int = 256, num_heads: int = 4, expand_k: float = 1.0,
                 expand_v: float = 1.0, mode: str = "chunk", layer_idx: int | None = None, **options):
        """options: DeltaLayer's (use_short_conv, conv_size, allow_neg_eigval, norm_eps)."""
        super().__init__(hidden_size, num_heads, expand_k, expand_v, mode, layer_idx, **options)

    def delta_inputs(self, x, q, k, v, beta):
        return q, k, v, beta
