"""GLA: chunked, fused-chunk and token-by-token Triton kernels."""
from fla_kernels.ops.gla.chunk import chunk_gla
from fla_kernels.ops.gla.fused_chunk import fused_chunk_gla
from fla_kernels.ops.gla.fused_recurrent import fused_recurrent_gla

__all__ = ["chunk_gla", "fused_chunk_gla", "fused_recurrent_gla"]
