"""Checks that numbers against a golden miss: inputs left untouched, repeatable runs, memory a
kernel forgot to write, and a sequence split into segments that chain their states."""
from __future__ import annotations

import sys
from contextlib import contextmanager

import torch


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.detach().contiguous().view(torch.uint8)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes (NaN payloads included)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def describe_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """'N of M elements, max |diff| X' for two same-shaped tensors that are not bitwise equal."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{tuple(a.shape)} {a.dtype} against {tuple(b.shape)} {b.dtype}"
    x, y = a.detach().double(), b.detach().double()
    differ = ~((x == y) | (x.isnan() & y.isnan()))
    diff = (x - y).abs()[differ]
    finite = diff[diff.isfinite()]
    largest = f"max |diff| {finite.max().item():.3g}" if finite.numel() else "non-finite values"
    return f"{int(differ.sum())} of {x.numel()} elements, {largest}"


@contextmanager
def nan_filled_allocations(package: str = "fla_kernels"):
    """Within the block, torch.empty-family calls made by code in `package` return float tensors
    filled with NaN, so output a kernel forgot to write reads as NaN instead of stale memory."""
    originals = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}
    new_empty = torch.Tensor.new_empty

    def poisoned(fn):
        def allocate(*args, **kwargs):
            x = fn(*args, **kwargs)
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if (caller == package or caller.startswith(package + ".")) and x.is_floating_point():
                x.fill_(float("nan"))
            return x
        return allocate

    try:
        for name, fn in originals.items():
            setattr(torch, name, poisoned(fn))
        torch.Tensor.new_empty = poisoned(new_empty)
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)
        torch.Tensor.new_empty = new_empty


def segment_bounds(T: int) -> list[tuple[int, int]]:
    """Two segments cut at T // 3, which for most T falls inside a chunk of 16 and of 64 tokens:
    the first returns a final state, the second starts from it, and the gradient flows back
    through it. (One cut covers both sides; more cuts would only cost more runs.)"""
    if T < 2:
        return []
    cut = max(1, T // 3)
    return [(0, cut), (cut, T)]
