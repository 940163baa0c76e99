"""Goldens of cases too large to take whole in float64 (the `limits` preset: chunk states past 2^31
elements): the references run on a seeded sample of the batch rows (or, packed, of the sequences)
at one head, and every result of the implementation, which runs on the whole case, is compared
there. Rows and heads are independent in every op, so the sample's golden is the whole golden's
restriction. The last row and the last head are always in the sample: their flat offsets are the
largest, where an int32 offset wraps."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from harness.inputs import CaseInputs

GOLDEN_LIMIT = 2 ** 28   # elements: a float64 tensor of 2 GiB; a case with a larger input is sampled
# elements of the states the float64 references hold for autograd (a state per step of the loop,
# per chunk of 16 in the chunked form), several times over: above it the case is sampled too
# (B=4096, H=32, T=32, K=V=16 asked the loop for 32 GiB more on an 80 GB H100)
STATE_LIMIT = 2 ** 29


@dataclass(frozen=True)
class Sample:
    """The batch rows (or packed sequences) `rows` at head `head`; `tokens`, for a packed case,
    the packed row's positions of those sequences, in order."""
    rows: tuple
    head: int
    tokens: torch.Tensor | None = None
    lengths: tuple = ()

    @staticmethod
    def covers(shape: tuple) -> bool:
        """Whether a tensor of symbolic `shape` has a part per batch row and head ([B, T, H, ...],
        states [B, H, ...] or [B, 1, H, ...]); a parameter shared by every row has none."""
        return tuple(shape[:1]) == ("B",) and "H" in shape

    def take(self, shape: tuple, x: torch.Tensor | None) -> torch.Tensor | None:
        """The sampled part of a tensor of symbolic `shape`: [B, T, H, ...] tensors at the sampled
        rows' tokens and head, states at the sampled rows and head; None for anything shared by
        every row (a parameter such as rwkv6's u), which a sample cannot compare."""
        if x is None or not self.covers(shape):
            return None
        if tuple(shape[:2]) == ("B", "T") and self.tokens is not None:
            picked = x.index_select(1, self.tokens.to(x.device))
        else:
            picked = x.index_select(0, torch.tensor(self.rows, device=x.device))
        return picked.narrow(shape.index("H"), self.head, 1)

    def inputs(self, spec, full: CaseInputs) -> CaseInputs:
        """The case's inputs restricted to the sample, for the references: a parameter over heads
        ([H, ...]) at the sampled head."""
        h = slice(self.head, self.head + 1)
        tensors = {}
        for s in spec.inputs:
            x = full.tensors[s.name]
            tensors[s.name] = x[h] if s.shape[:1] == ("H",) else self.take(s.shape, x)
        state_shapes = [st.shape for st in spec.states]
        dims = {**full.dims, "H": 1}
        if self.tokens is not None:
            dims["T"] = len(self.tokens)
        else:
            dims["B"] = len(self.rows)
        cu = None
        if full.cu_seqlens is not None:
            cu = torch.tensor([0, *self.lengths], device=full.cu_seqlens.device).cumsum(0).to(torch.int32)
        return dataclasses.replace(
            full, tensors=tensors, dims=dims, state_dims={**full.state_dims, "B": len(self.rows), "H": 1},
            initial_states=None if full.initial_states is None else tuple(
                self.take(shape, x) for shape, x in zip(state_shapes, full.initial_states)),
            do=self.take(("B", "T", "H", "V"), full.do),
            dhts=tuple(self.take(shape, x) for shape, x in zip(state_shapes, full.dhts)), cu_seqlens=cu)

    def describe(self, packed: bool) -> str:
        what = "sequences" if packed else "batch rows"
        return f"{what} {', '.join(map(str, self.rows))} at head {self.head}"


def reference_states(spec, full: CaseInputs) -> int:
    """Elements of the states the float64 references keep: per step of the loop (T <= the op's
    loop_max_T), else per chunk of 16 of the chunked form."""
    T = full.dims["T"]
    steps = T if T <= spec.loop_max_T else -(-T // 16)
    per_step = sum(math.prod(spec.shape_of(s, full.state_dims)) for s in spec.states)
    return per_step * steps


def choose_sample(spec, case, full: CaseInputs) -> Sample | None:
    """None when every input of the case fits GOLDEN_LIMIT elements and the references' states
    STATE_LIMIT (the golden is taken whole), else the sample: the first, the last and one random
    row (or packed sequence) of the case's seed, at the last head."""
    if (max(x.numel() for x in full.tensors.values()) <= GOLDEN_LIMIT
            and reference_states(spec, full) <= STATE_LIMIT):
        return None
    count = len(full.bounds) - 1 if full.bounds else full.dims["B"]
    gen = torch.Generator().manual_seed(case.seed)
    rows = tuple(sorted({0, count - 1, int(torch.randint(0, count, (1,), generator=gen))}))
    if not full.bounds:
        return Sample(rows, case.H - 1)
    bounds = full.bounds
    tokens = torch.cat([torch.arange(bounds[n], bounds[n + 1]) for n in rows])
    return Sample(rows, case.H - 1, tokens, tuple(bounds[n + 1] - bounds[n] for n in rows))
