"""Pieces shared by the chunked references: padding, rounding, the chunk-to-chunk scan."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def work_dtype_of(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every lower precision computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round to `dtype` and back: a matrix-product operand as a kernel in that dtype sees it."""
    return x.to(dtype).to(x.dtype)


def pad_time(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[B, T, H, D] -> [B, H, N, chunk_size, D], zero-padded at the end of time."""
    B, T, H, D = x.shape
    N = -(-T // chunk_size)
    x = F.pad(x, (0, 0, 0, 0, 0, N * chunk_size - T))
    return x.reshape(B, N, chunk_size, H, D).permute(0, 3, 1, 2, 4)


def chunked_scan(decays, increments, initial_state=None):
    """States entering each chunk and the final state of h_{n+1} = decay_n * h_n + increment_n.

    decays broadcast against increments [B, H, N, K, V]; the loop runs over
    unbound chunks so autograd stays linear in the number of chunks.
    """
    B, H, N, K, V = increments.shape
    state = increments.new_zeros(B, H, K, V) if initial_state is None else initial_state
    starts = []
    for decay, increment in zip(decays.unbind(2), increments.unbind(2)):
        starts.append(state)
        state = decay * state + increment
    return torch.stack(starts, dim=2), state


def map_chunk_groups(fn, *tensors, elements_per_chunk: int, max_elements: int = 1 << 26):
    """fn over groups of chunks (dim 2), concatenated; checkpointed so only one group's
    intermediates are alive at a time (the [C, C, D] score tensors of long sequences are large)."""
    N = tensors[0].shape[2]
    group = max(1, max_elements // max(1, elements_per_chunk))
    if group >= N:
        return fn(*tensors)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    outputs = []
    for parts in zip(*(torch.split(t, group, dim=2) for t in tensors)):
        if needs_grad:
            outputs.append(torch.utils.checkpoint.checkpoint(fn, *parts, use_reentrant=False))
        else:
            outputs.append(fn(*parts))
    return torch.cat(outputs, dim=2)
