"""The gated delta rule: token-by-token Triton kernels."""
from fla_kernels.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule

__all__ = ["fused_recurrent_gated_delta_rule"]
