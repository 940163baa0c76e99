"""RWKV6: chunked and token-by-token Triton kernels."""
from fla_kernels.ops.rwkv6.chunk import chunk_rwkv6
from fla_kernels.ops.rwkv6.fused_recurrent import fused_recurrent_rwkv6

__all__ = ["chunk_rwkv6", "fused_recurrent_rwkv6"]
