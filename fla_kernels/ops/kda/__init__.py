"""Kimi delta attention: token-by-token Triton kernels."""
from fla_kernels.ops.kda.fused_recurrent import fused_recurrent_kda

__all__ = ["fused_recurrent_kda"]
