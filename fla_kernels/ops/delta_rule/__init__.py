"""The delta rule: chunked and token-by-token Triton kernels."""
from fla_kernels.ops.delta_rule.chunk import chunk_delta_rule
from fla_kernels.ops.delta_rule.fused_recurrent import fused_recurrent_delta_rule

__all__ = ["chunk_delta_rule", "fused_recurrent_delta_rule"]
