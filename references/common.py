"""Pieces shared by the references: the token-by-token loop, the chunked forms' set-up (scale,
working dtype, operand rounding, padding) and their end, gated scores, the chunk-to-chunk scan."""
from __future__ import annotations

from itertools import repeat

import torch
import torch.nn.functional as F


def default_scale(K: int, scale):
    """The ops' scale: K ** -0.5 unless one is given."""
    return K ** -0.5 if scale is None else scale


def start_state(initial_state, like: torch.Tensor, shape) -> torch.Tensor:
    """A loop's first state: the initial state in `like`'s dtype, or zeros of `shape`."""
    return like.new_zeros(shape) if initial_state is None else initial_state.to(like.dtype)


def recurrent_loop(step, state, *sequences):
    """(o, last state) of a token-by-token loop: state, o_t = step(state, x_t, ...) over time
    (dim 1) of each sequence (None gives None at every step), o stacked over time.

    Python over unbound steps, so autograd through it stays linear in T."""
    outputs = []
    for xs in zip(*(repeat(None) if x is None else x.unbind(1) for x in sequences)):
        state, o_t = step(state, *xs)
        outputs.append(o_t)
    return torch.stack(outputs, dim=1), state


def work_dtype_of(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every lower precision computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round to `dtype` and back: a matrix-product operand as a kernel in that dtype sees it."""
    return x.to(dtype).to(x.dtype)


def operand_rounding(operand_dtype):
    """What the chunked forms apply to every matrix-product operand: `round_to(x, operand_dtype)`,
    or nothing when operand_dtype is None."""
    return (lambda x: round_to(x, operand_dtype)) if operand_dtype is not None else (lambda x: x)


def pad_time(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[B, T, H, D] -> [B, H, N, chunk_size, D], zero-padded at the end of time."""
    B, T, H, D = x.shape
    N = -(-T // chunk_size)
    x = F.pad(x, (0, 0, 0, 0, 0, N * chunk_size - T))
    return x.reshape(B, N, chunk_size, H, D).permute(0, 3, 1, 2, 4)


def chunk_inputs(inputs, scale, chunk_size: int, operand_dtype):
    """The start of a chunked form, from its [B, T, H, D] inputs (the first one the query):
    (scale, operand rounding, the inputs in the working dtype as [B, H, N, C, D] chunks).

    The working dtype is float64 for float64 inputs, float32 otherwise: gates, exponentials,
    accumulations and the carried state stay in it while `operand_dtype` (bf16 / fp16) rounds the
    operands of every matrix product, the arithmetic of a straightforward production kernel in
    that dtype. Zero padding at the end of time leaves a state as it is (zero gates, zero keys)."""
    wd = work_dtype_of(inputs[0].dtype)
    chunks = [pad_time(x.to(wd), chunk_size) for x in inputs]
    return default_scale(inputs[0].shape[-1], scale), operand_rounding(operand_dtype), chunks


def chunks_to_time(o: torch.Tensor, T: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, H, N, C, V] -> [B, T, H, V] in `dtype`, the padding past T dropped."""
    B, H, N, C, V = o.shape
    return o.permute(0, 2, 3, 1, 4).reshape(B, N * C, H, V)[:, :T].to(dtype)


def gated_scores(q, k, Gq, Gk, diagonal: int = 0):
    """A_ij = sum_d q_id k_jd exp(Gq_id - Gk_jd) for j <= i + diagonal (0: j <= i; -1: j < i), else 0;
    [..., C, D] -> [..., C, C]. Only differences at or below the diagonal, <= 0 for cumulative log
    gates, are exponentiated: the others are masked first, so strong decay stays finite."""
    C = q.shape[-2]
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(diagonal)
    diff = Gq[..., :, None, :] - Gk[..., None, :, :]
    diff = diff.masked_fill(~lower[..., None], float("-inf"))
    return (q[..., :, None, :] * k[..., None, :, :] * torch.exp(diff)).sum(-1)


def chunked_scan(decays, increments, initial_state=None):
    """States entering each chunk and the final state of h_{n+1} = decay_n * h_n + increment_n.

    decays broadcast against increments [B, H, N, K, V]; the initial state is taken in the
    increments' dtype; the loop runs over unbound chunks so autograd stays linear in the number
    of chunks.
    """
    B, H, N, K, V = increments.shape
    state = start_state(initial_state, increments, (B, H, K, V))
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
