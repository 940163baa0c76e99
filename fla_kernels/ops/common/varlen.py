"""Packed variable-length batches (`cu_seqlens`) on a chunk-aligned row.

A packed call holds N sequences one after another along T of a batch of one: sequence n is the
tokens cu_seqlens[n]:cu_seqlens[n + 1], with its own initial and final state. The kernels run it
on an aligned row instead (`Packing`): each sequence preceded by zero rows up to a whole number of
chunks, so that it ends on a chunk boundary and no chunk holds two sequences. The zero rows change
nothing: zero keys, values and slots add nothing to a state and zero log gates decay it by
exp(0) = 1, so the state entering a sequence's first token is its initial state and the state
leaving its last chunk its final state; outputs and gradients of the zero rows are dropped.

Every intra-chunk computation is chunk-local (gate sums are taken within a chunk, see
chunk_state.py) and runs on the aligned row unchanged. Only the state walks cross chunks: given
the sequences' chunk offsets, the program of a walk for (sequence n, head h) walks the chunks of
sequence n alone, from initial state n to final state n (`sequence_walk`).

Why the zero rows go before a sequence and not after it: a chunk's last row is then the
sequence's last token, whose own path into the leaving state carries no gate and which the gate
gradients therefore leave out of both sides of their chunk sums (gate_grad.py); with zero rows
after it that gate-free term would stay in both and cancel only to rounding, which strong decay
makes as large as dg itself. Rows before a token enter no sum of its gate gradient (those run
from a row to the chunk's end), so the zero rows in front are felt nowhere.
"""
from __future__ import annotations

from itertools import accumulate

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.batch_groups import apply_in_groups


class Packing:
    """The aligned row of a packed batch: where each token lies on it and the sequences' chunks.

    cu_seqlens: the cumulative sequence starts as host integers (`check_inputs` reads them);
    chunk_size: the chunk of the kernels that will run on the row.
    """

    def __init__(self, cu_seqlens, chunk_size: int, device):
        lengths = [b - a for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])]
        offsets = list(accumulate((triton.cdiv(n, chunk_size) for n in lengths), initial=0))
        self.N, self.T = len(lengths), cu_seqlens[-1]
        self.T_aligned = offsets[-1] * chunk_size
        # chunk offsets [N + 1], int64: sequence n is chunks offsets[n]..offsets[n + 1] - 1
        self.chunk_offsets = torch.tensor(offsets, dtype=torch.int64, device=device)
        # token t of sequence n lies at t + offsets[n + 1] * chunk_size - cu_seqlens[n + 1]
        shifts = torch.tensor([c * chunk_size - end for c, end in zip(offsets[1:], cu_seqlens[1:])],
                              dtype=torch.int64, device=device)
        repeats = torch.tensor(lengths, dtype=torch.int64, device=device)
        self.index = (torch.arange(self.T, dtype=torch.int64, device=device)
                      + shifts.repeat_interleave(repeats, output_size=self.T))

    @classmethod
    def of(cls, sizes: dict, chunk_size: int, device):
        """The packing of a call from its `check_inputs` sizes, or None for an unpacked call."""
        return cls(sizes["cu_seqlens"], chunk_size, device) if "cu_seqlens" in sizes else None

    def aligned(self, x: torch.Tensor) -> torch.Tensor:
        """x [1, T, ...] on the aligned row [1, T_aligned, ...], zeros elsewhere (differentiable)."""
        zeros = x.new_zeros((1, self.T_aligned) + tuple(x.shape[2:]))
        return zeros.index_copy(1, self.index, x)

    def packed(self, x: torch.Tensor) -> torch.Tensor:
        """x [1, T_aligned, ...] back on the packed row [1, T, ...] (differentiable)."""
        return x.index_select(1, self.index)


def apply_packed(function, packing, tensors, time_axes, *rest):
    """function.apply(*tensors, *rest) when packing is None (over groups of batch entries where
    its backward's partials would not fit: `apply_in_groups`); else function.apply(*tensors, *rest,
    chunk_offsets) with the tensors that have a time axis (`time_axes`, one bool per tensor) on
    the aligned row and the packing's chunk offsets, its first result (o) brought back to the
    packed row (the others, final states, are per sequence already). A Function that takes
    packed batches has a last argument chunk_offsets=None."""
    if packing is None:
        return apply_in_groups(function, tensors, time_axes, *rest)
    tensors = [packing.aligned(x) if x is not None and on_time else x
               for x, on_time in zip(tensors, time_axes)]
    o, *states = function.apply(*tensors, *rest, packing.chunk_offsets)
    return (packing.packed(o), *states)


def state_count(B: int, chunk_offsets) -> int:
    """How many initial and final states a call has: one per sequence of a packed call (its
    chunk offsets given), else one per batch entry."""
    return B if chunk_offsets is None else chunk_offsets.numel() - 1


@triton.jit
def sequence_walk(chunk_offsets, i_bh, NT, H: tl.constexpr, VARLEN: tl.constexpr):
    """(i_b, i_h, i_row, c_lo, c_hi): what the state walk of program i_bh (int64) reads.

    Without VARLEN i_bh = b * H + h walks the NT chunks of batch entry b; with VARLEN, on the
    aligned row (B = 1), i_bh = n * H + h walks the chunks of sequence n, chunk_offsets[n] to
    chunk_offsets[n + 1] - 1. Either way i_bh numbers its initial and final state. i_b, i_h: the
    batch entry and head of the rows it reads; i_row = i_b * H + i_h, their number among the
    per-chunk buffers [B, H, NT, ...]; [c_lo, c_hi): the chunks it walks.
    """
    if VARLEN:
        i_n, i_h = i_bh // H, i_bh % H
        return i_h * 0, i_h, i_h, tl.load(chunk_offsets + i_n), tl.load(chunk_offsets + i_n + 1)
    else:
        return i_bh // H, i_bh % H, i_bh, 0, NT
