"""Linear attention: chunked, fused-chunk and token-by-token Triton kernels."""
from fla_kernels.ops.linear_attn.chunk import chunk_linear_attn
from fla_kernels.ops.linear_attn.fused_chunk import fused_chunk_linear_attn
from fla_kernels.ops.linear_attn.fused_recurrent import fused_recurrent_linear_attn

__all__ = ["chunk_linear_attn", "fused_chunk_linear_attn", "fused_recurrent_linear_attn"]
