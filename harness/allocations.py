"""Memory a kernel forgot to write, made visible: fresh allocations of the kernels' package, and of
the package of the implementation under test (upstream fla's, a pull request's), read as NaN while
an implementation runs."""
from __future__ import annotations

import sys
from contextlib import contextmanager

import torch


# packages whose own allocations are never poisoned: their code is not under test, and may allocate
# scratch it fills only in part
FOUNDATIONS = frozenset({"torch", "triton", "numpy", "einops", "harness", "references", "builtins"})


def package_of(fn) -> str | None:
    """The top-level package of the code behind `fn`: its `package_under_test` (an adapter's, to the
    package it calls), else its module's (through functools.wraps layers); None for a
    foundation's (FOUNDATIONS) or one of unknown origin."""
    if getattr(fn, "package_under_test", None):
        return fn.package_under_test
    fn = getattr(fn, "__wrapped__", fn)
    module = getattr(fn, "__module__", None) or getattr(type(fn), "__module__", None) or ""
    top = module.split(".")[0]
    return None if not top or top in FOUNDATIONS or top == "__main__" else top


@contextmanager
def nan_filled_allocations(*packages: str):
    """Within the block, torch.empty-family calls made by code in `packages` (default: ours,
    fla_kernels) return float tensors filled with NaN, so output a kernel forgot to write reads as
    NaN instead of stale memory."""
    packages = tuple(p for p in packages if p) or ("fla_kernels",)
    originals = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}
    new_empty = torch.Tensor.new_empty

    def poisoned(fn):
        def allocate(*args, **kwargs):
            x = fn(*args, **kwargs)
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if x.is_floating_point() and any(caller == p or caller.startswith(p + ".") for p in packages):
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
