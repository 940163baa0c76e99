"""A large call run over groups of its batch entries, so that a backward's float32 partials fit.

Kernels split over a head dimension write one float32 partial result per block (partials.py):
the fused-recurrent backward holds dq, dk, dq' and dk' per V-block, four times NV times q's size.
At B=16, T=65536, H=8, K=V=128 those are 69 GB. The batch entries of an unpacked call are
independent, so a Function that declares its partials per batch entry (`parts_per_row(tensors)`,
float32 elements) is applied to groups of entries whose partials stay within PARTS_BUDGET, and the
results joined along the batch: every entry's numbers are those of the whole call, bit for bit
(a parameter shared by every entry, rwkv6's u, gets its gradient summed group by group: equal to
rounding), and a call that fits runs as one group.
"""
from __future__ import annotations

import torch

PARTS_BUDGET = 2 ** 31  # float32 partial elements one group's backward may hold (8 GiB)


def batch_groups(B: int, parts_per_row: int) -> list[tuple[int, int]]:
    """[(b0, b1), ...]: ranges of the B entries holding at most PARTS_BUDGET partial elements each
    (one entry a group at least)."""
    rows = max(1, PARTS_BUDGET // max(parts_per_row, 1))
    return [(b0, min(b0 + rows, B)) for b0 in range(0, B, rows)]


def apply_in_groups(function, tensors, batched, *rest):
    """function.apply(*tensors, *rest) for an unpacked batch; where function.parts_per_row(tensors)
    asks for `batch_groups`, rest is (scale, initial_state, output_final_state) and each group gets
    the tensors marked in `batched` and initial_state cut along the batch, the others shared; the
    results (o [B, ...] and the final state [B, ...] or None) joined along the batch."""
    per_row = getattr(function, "parts_per_row", None)
    B = tensors[0].shape[0]
    groups = batch_groups(B, per_row(tensors)) if per_row else [(0, B)]
    if len(groups) == 1:
        return function.apply(*tensors, *rest)
    scale, initial_state, output_final_state = rest
    results = []
    for b0, b1 in groups:
        part = [x[b0:b1] if x is not None and cut else x for x, cut in zip(tensors, batched)]
        h0 = None if initial_state is None else initial_state[b0:b1]
        results.append(function.apply(*part, scale, h0, output_final_state))
    return tuple(None if r[0] is None else torch.cat(r) for r in zip(*results))
