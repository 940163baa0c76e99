"""Packed variable-length batches, as the library takes them for training: the sequences of
unequal lengths a packed case cuts its tokens into (`cu_seqlens`, int32 [N + 1], B = 1), and
any function of the op run on packed inputs sequence by sequence, each sequence its own call
(how the references take packed cases, and the plain run the packing check compares with)."""
from __future__ import annotations

import functools
import re

import torch

CHUNK = 64   # the production kernels' chunk: where a boundary inside a chunk and a long sequence matter


def sequence_count(B: int, gen: torch.Generator) -> int:
    """How many sequences a packed case of B rows cuts its tokens into: B and one to four more,
    so that a packed batch has more sequences than the plain one has rows."""
    return B + 1 + _draw(gen, 3)


def sequence_lengths(total: int, count: int, gen: torch.Generator) -> list[int]:
    """The lengths of `count` sequences (fewer if `total` is shorter) of a packed case of `total`
    tokens, drawn from `gen`: one of length 1, one longer than a chunk where `total` leaves room
    for it, the others of random unequal lengths (so boundaries fall inside chunks), in random
    order."""
    count = min(count, total)
    if count == 1:
        return [total]
    fixed, left, others = [1], total - 1, count - 1
    room = left - (others - 1)          # what the long one may take, the others keeping a token each
    if others > 1 and room > CHUNK + 1:
        long = CHUNK + 1 + _draw(gen, (room - CHUNK - 1) // 2)
        fixed.append(long)
        left, others = left - long, others - 1
    cuts = sorted((torch.randperm(left - 1, generator=gen)[:others - 1] + 1).tolist())
    rest = [b - a for a, b in zip([0, *cuts], [*cuts, left])]
    lengths = fixed + rest
    order = torch.randperm(len(lengths), generator=gen).tolist()
    return [lengths[i] for i in order]


def _draw(gen: torch.Generator, high: int) -> int:
    """An integer in [0, high]."""
    return int(torch.randint(0, high + 1, (1,), generator=gen))


def cu_seqlens_of(lengths: list[int], device) -> torch.Tensor:
    """The cumulative starts [0, l0, l0 + l1, ..., total], int32, as the library takes them."""
    starts = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return starts.to(device)


def per_sequence(fn, spec):
    """`fn`, a function of the op on batches of whole sequences, as one that takes packed inputs
    (`cu_seqlens`, B = 1, states [N, ...]): it calls `fn` once per sequence (B = 1, that sequence's
    tokens and initial state) and packs what the calls return (o along T, final states along N).
    Inputs without a time axis (rwkv6's u) go to every call whole; inputs passed by name
    (`InputSpec.keyword`) are cut like the others."""
    sequence_inputs = spec.sequence_inputs()
    names = [s.name for s in spec.inputs if not s.keyword]
    single = len(spec.states) == 1

    def piece(name, x, t0, t1):
        return x[:, t0:t1] if name in sequence_inputs and x is not None else x

    @functools.wraps(fn)
    def packed(*args, cu_seqlens, initial_state=None, output_final_state=False, **kwargs):
        bounds = cu_seqlens.tolist()
        outputs, finals = [], []
        for n, (t0, t1) in enumerate(zip(bounds, bounds[1:])):
            pieces = [piece(name, x, t0, t1) for name, x in zip(names, args)]
            named = {name: piece(name, x, t0, t1) for name, x in kwargs.items()}
            h0 = None
            if initial_state is not None:
                h0 = initial_state[n:n + 1] if single else tuple(s[n:n + 1] for s in initial_state)
            o, final = fn(*pieces, initial_state=h0, output_final_state=output_final_state, **named)
            outputs.append(o)
            finals.append((final,) if single else final)
        o = torch.cat(outputs, dim=1)
        if not output_final_state:
            return o, None
        stacked = tuple(torch.cat(parts, dim=0) for parts in zip(*finals))
        return o, stacked[0] if single else stacked

    return packed


_PACKED_ROW_PLACE = re.compile(r"\(b=0, t=(\d+)([^)]*)\)")


def name_sequences(metrics: dict, bounds: list[int] | None) -> dict:
    """`metrics` with each place in the packed row ("(b=0, t=87, h=1)", in `first_bad` and the
    message) named by its sequence ("(sequence 2 of 4: t=17 of 70, h=1)"), so a failing row
    says which sequence went wrong; unchanged when not packed (`bounds` None)."""
    if not bounds:
        return metrics

    def named(match):
        t = int(match.group(1))
        n = max(i for i, start in enumerate(bounds[:-1]) if start <= t)
        return (f"(sequence {n} of {len(bounds) - 1}: t={t - bounds[n]} of {bounds[n + 1] - bounds[n]}"
                f"{match.group(2)})")

    return {k: _PACKED_ROW_PLACE.sub(named, v) if k in ("first_bad", "message") and isinstance(v, str) else v
            for k, v in metrics.items()}
