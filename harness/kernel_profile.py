"""Where a candidate's time goes: device time per kernel of forward+backward passes, from the
torch profiler (`python -m harness bench --kernels`).

The per-kernel split is what tells a kernel author which launch to work on; the bench's medians
say only how long the whole pass takes. Times are the profiler's device durations of each kernel,
summed over `passes` passes and divided by it; gaps between launches are not counted.
"""
from __future__ import annotations

from collections import Counter

import torch

PASSES = 5


def device_events(step, passes: int = PASSES) -> list[tuple[str, float]]:
    """(kernel name, device microseconds) of every GPU kernel that `passes` calls of step launch,
    after one unprofiled warm-up call; [] without CUDA (the interpreter launches no kernels)."""
    if not torch.cuda.is_available():
        return []
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(passes):
            step()
        torch.cuda.synchronize()
    return [(e.name, e.device_time_total) for e in prof.events() if e.device_type.name == "CUDA"]


def per_pass(events: list[tuple[str, float]], passes: int = PASSES) -> list[dict]:
    """One row per kernel name, longest first: launches per pass, ms per pass and its share of
    the pass's kernel time."""
    total, calls = Counter(), Counter()
    for name, us in events:
        total[name] += us
        calls[name] += 1
    whole = sum(total.values())
    return [{"kernel": name, "calls": calls[name] / passes, "ms": us / passes / 1e3,
             "share": us / whole if whole else 0.0} for name, us in total.most_common()]
