"""Bitwise comparison of tensors, for the checks that ask "did anything change at all"."""
from __future__ import annotations

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
