"""Production Triton kernels for linear-attention variants.

Without CUDA the kernels run through Triton's interpreter; the switch must be
set before any kernel is defined, so it happens here, first.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fla_kernels.ops.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6  # noqa: E402

__all__ = ["chunk_rwkv6", "fused_recurrent_rwkv6"]
