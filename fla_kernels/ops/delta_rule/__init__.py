"""The delta rule: token-by-token Triton kernels."""
from fla_kernels.ops.delta_rule.fused_recurrent import fused_recurrent_delta_rule

__all__ = ["fused_recurrent_delta_rule"]
