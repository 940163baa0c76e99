"""Gated slot attention: chunked and token-by-token Triton kernels."""
from fla_kernels.ops.gsa.chunk import chunk_gsa
from fla_kernels.ops.gsa.fused_recurrent import fused_recurrent_gsa

__all__ = ["chunk_gsa", "fused_recurrent_gsa"]
