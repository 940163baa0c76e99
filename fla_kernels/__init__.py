"""Production Triton kernels for linear-attention variants.

Without CUDA the kernels run through Triton's interpreter; the switch must be
set before any kernel is defined, so it happens here, first.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fla_kernels.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule  # noqa: E402
from fla_kernels.ops.gated_delta_rule import (chunk_gated_delta_rule,  # noqa: E402
                                              fused_recurrent_gated_delta_rule)
from fla_kernels.ops.gla import chunk_gla, fused_chunk_gla, fused_recurrent_gla  # noqa: E402
from fla_kernels.ops.gsa import chunk_gsa, fused_recurrent_gsa  # noqa: E402
from fla_kernels.ops.kda import chunk_kda, fused_recurrent_kda  # noqa: E402
from fla_kernels.ops.linear_attn import (chunk_linear_attn, fused_chunk_linear_attn,  # noqa: E402
                                         fused_recurrent_linear_attn)
from fla_kernels.ops.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6  # noqa: E402
from fla_kernels.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla  # noqa: E402

__all__ = [
    "chunk_delta_rule", "fused_recurrent_delta_rule",
    "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_kda", "fused_recurrent_kda",
    "chunk_gla", "fused_chunk_gla", "fused_recurrent_gla",
    "chunk_gsa", "fused_recurrent_gsa",
    "chunk_linear_attn", "fused_chunk_linear_attn", "fused_recurrent_linear_attn",
    "chunk_rwkv6", "fused_recurrent_rwkv6",
    "chunk_simple_gla", "fused_recurrent_simple_gla",
]
