"""A release's layer helpers (short convolutions, norms, activations) run in float32 inside a
float64 layer.

Upstream layers call helper kernels of their own besides the op's (fla.modules: Triton kernels
that accumulate in float32 and do not compile for float64). The float64 golden of such a layer
calls each helper with its float64 tensors rounded to float32 and takes its float32 results back
as float64, so the autograd graph runs through the casts to the float64 parameters. The golden
then carries the helpers' own float32 roundings, about 6e-8 relative: far below 16-bit errors,
and of the size of the helpers' roundings in a float32 layer and its baseline alike.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys

import torch

from harness.checks.layer import tensors_in


def _cast(value, source: torch.dtype, target: torch.dtype):
    """`value` with every `source` tensor in it (through tuples, lists and dicts) as `target`."""
    if isinstance(value, torch.Tensor):
        return value.to(target) if value.dtype == source else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_cast(v, source, target) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, source, target) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, source, target) for k, v in value.items()}
    return value


_depth = [0]   # helper calls under way: a helper's calls to other helpers stay in float32


def in_float32(fn):
    """`fn` taking float64 tensors as float32 and giving float32 results back as float64, where it
    is called with a float64 tensor and not by another such helper. A helper's autograd backward
    calls its helpers with the float32 tensors its forward saved (fla 0.6.0's `rms_norm_linear`
    recomputes its norm's output in `layer_norm_bwd`): those calls are left in float32."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if _depth[0] or not any(t.dtype == torch.float64 for t in tensors_in((args, kwargs))):
            return fn(*args, **kwargs)
        args, kwargs = _cast((args, kwargs), torch.float64, torch.float32)
        _depth[0] += 1
        try:
            result = fn(*args, **kwargs)
        finally:
            _depth[0] -= 1
        return _cast(result, torch.float32, torch.float64)
    return call


@contextlib.contextmanager
def helpers_in_float32(package: str):
    """Every function defined under `package` (such as "fla.modules"), wherever a loaded module
    of the same top-level package holds it, `in_float32` for the duration."""
    top = package.split(".")[0]
    saved = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == top or name.startswith(top + ".")):
            continue
        for attribute, value in list(vars(module).items()):
            if inspect.isfunction(value) and (value.__module__ or "").startswith(package):
                saved.append((module, attribute, value))
                setattr(module, attribute, in_float32(value))
    try:
        yield
    finally:
        for module, attribute, value in saved:
            setattr(module, attribute, value)
