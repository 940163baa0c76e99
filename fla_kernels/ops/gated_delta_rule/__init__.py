"""The gated delta rule: chunked and token-by-token Triton kernels."""
from fla_kernels.ops.gated_delta_rule.chunk import chunk_gated_delta_rule
from fla_kernels.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"]
