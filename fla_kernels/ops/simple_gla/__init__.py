"""Simple GLA (one log gate per head and step): chunked and token-by-token Triton kernels."""
from fla_kernels.ops.simple_gla.chunk import chunk_simple_gla
from fla_kernels.ops.simple_gla.fused_recurrent import fused_recurrent_simple_gla

__all__ = ["chunk_simple_gla", "fused_recurrent_simple_gla"]
