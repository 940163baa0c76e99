"""The sum of a kernel's float32 partial results over their leading axis, cast in the same pass.

Kernels split over a head dimension (one program per K- or V-block) write one partial result per
block; `parts.sum(0).to(dtype)` reads them, writes a float32 sum and reads it again to cast it.
`sum_parts` reads the partials once and writes the result in its dtype: on the H100 the three
gradients of the fused-chunk linear attention backward spent a third of its time in those torch
sums. The partials are added in order (0, 1, ...), so the result is deterministic.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.precision import store_dtype
from fla_kernels.ops.common.launch import launch

BLOCK = 2048


@triton.jit
def _sum_parts_kernel(parts, out, N, NP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    part = parts + offs
    acc = tl.load(part, mask=mask, other=0)
    for _ in tl.static_range(1, NP):
        # a pointer step of N per part: i_p * N in int32 wraps once the parts pass 2^31 elements
        part += N
        acc += tl.load(part, mask=mask, other=0)
    tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


def sum_parts(parts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """parts [n, *shape] float32 (or a single part in any dtype) -> their sum [*shape] in dtype."""
    if parts.shape[0] == 1:
        return parts[0].to(dtype)
    parts = parts.contiguous()
    out = torch.empty(parts.shape[1:], dtype=store_dtype(dtype), device=parts.device)
    n = out.numel()
    launch(_sum_parts_kernel, (triton.cdiv(n, BLOCK),), parts, out, n, NP=parts.shape[0], BLOCK=BLOCK)
    return out.to(dtype)
