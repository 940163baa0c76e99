"""Kimi delta attention: chunked and token-by-token Triton kernels."""
from fla_kernels.ops.kda.chunk import chunk_kda
from fla_kernels.ops.kda.fused_recurrent import fused_recurrent_kda

__all__ = ["chunk_kda", "fused_recurrent_kda"]
