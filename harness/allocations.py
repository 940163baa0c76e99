"""Memory a kernel forgot to write, made visible: fresh allocations of the kernels' package read
as NaN while an implementation runs."""
from __future__ import annotations

import sys
from contextlib import contextmanager

import torch


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
