"""Argument checks shared by every op's public functions, and whether the interpreter runs them."""
from __future__ import annotations

import os

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_inputs(op: str, tensors: dict, shapes: dict, initial_state=None, state_shape=None):
    """Raise ValueError with one plain sentence if the arguments cannot be run.

    tensors: name -> tensor; shapes: name -> expected shape tuple (ints).
    """
    first = next(iter(tensors.values()))
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}.")
        if x.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{op}: {name} has dtype {x.dtype}; expected float32, float16 or bfloat16.")
        if x.device != first.device:
            raise ValueError(f"{op}: {name} is on {x.device} but the other inputs are on {first.device}.")
        if tuple(x.shape) != tuple(shapes[name]):
            raise ValueError(f"{op}: {name} has shape {tuple(x.shape)}; expected {tuple(shapes[name])}.")
    dtypes = {x.dtype for x in tensors.values()}
    if len(dtypes) > 1:
        raise ValueError(f"{op}: inputs mix dtypes {sorted(str(d) for d in dtypes)}; pass one dtype.")
    if first.device.type not in ("cuda", "cpu") or (first.device.type == "cpu" and not interpreting()):
        raise ValueError(f"{op}: inputs are on {first.device}; Triton kernels need a CUDA device "
                         "(or TRITON_INTERPRET=1 for CPU tensors).")
    if initial_state is not None:
        states = initial_state if isinstance(initial_state, (tuple, list)) else (initial_state,)
        shapes_ = state_shape if isinstance(initial_state, (tuple, list)) else (state_shape,)
        for s, shape in zip(states, shapes_):
            if not isinstance(s, torch.Tensor):
                raise ValueError(f"{op}: initial_state must be a torch.Tensor or None.")
            if tuple(s.shape) != tuple(shape):
                raise ValueError(f"{op}: initial_state has shape {tuple(s.shape)}; expected {tuple(shape)}.")
            if s.device != first.device:
                raise ValueError(f"{op}: initial_state is on {s.device} but the inputs are on {first.device}.")
            if s.dtype not in SUPPORTED_DTYPES:
                raise ValueError(f"{op}: initial_state has dtype {s.dtype}; expected float32.")
    if first.shape[1] < 1:
        raise ValueError(f"{op}: the sequence is empty (T = 0); T must be at least 1.")
