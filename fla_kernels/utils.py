"""Argument checks shared by every op's public functions, and whether the interpreter runs them."""
from __future__ import annotations

import os

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# the log-gate inputs and the delta rule's step size beta: float32 beside 16-bit activations is
# allowed for them (layers compute gates in float32), as upstream accepts it
GATE_INPUTS = ("g", "w", "g_gamma", "beta")


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _dims(layout: str) -> str:
    """'BTHK' -> '[B, T, H, K]'."""
    return "[" + ", ".join(layout) + "]"


def check_inputs(op: str, tensors: dict, layouts: dict, optional=(), initial_state=None,
                 states="BHKV", cu_seqlens=None) -> dict:
    """The one argument check of every public op: raise ValueError with one plain sentence that
    names `op` and the argument, before any kernel launches, if the arguments cannot be run;
    else return the sizes, {letter: size}.

    tensors: name -> argument, in call order; layouts: name -> its dimensions as letters
    ("BTHK" for [B, T, H, K]), one size per letter, set by the first input that has it (q sets
    B, T, H, K; v then V). optional: the names that may be None. states: the layout of
    initial_state, which may be None, or name -> layout where initial_state is a tuple of
    states ({"hk": "BHKM", "hv": "BHMV"}); a digit in a layout is that size ("B1HK").
    The inputs share one dtype, but a gate (`GATE_INPUTS`) may be float32 beside 16-bit ones.
    cu_seqlens: None, or the cumulative sequence starts [N + 1] of a packed batch (B = 1,
    sequence n the tokens cu_seqlens[n]:cu_seqlens[n + 1]), whose states are one per sequence
    (their B is N).

    The sizes hold N, the number of initial and final states: B, or with cu_seqlens the number
    of sequences, and then also "cu_seqlens", its values as a tuple of ints (read to the host
    once, here).
    """
    sizes = {}
    first = None
    for name, x in tensors.items():
        layout = layouts[name]
        if x is None and name in optional:
            continue
        or_none = " or None" if name in optional else ""
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{op}: {name} must be a torch.Tensor{or_none}, got {type(x).__name__}.")
        if x.dim() != len(layout):
            raise ValueError(f"{op}: {name} must be a {len(layout)}-D tensor {_dims(layout)}{or_none}, "
                             f"got a {x.dim()}-D one.")
        if x.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{op}: {name} has dtype {x.dtype}; expected float32, float16 or bfloat16.")
        first = x if first is None else first
        if x.device != first.device:
            raise ValueError(f"{op}: {name} is on {x.device} but the other inputs are on {first.device}.")
        for letter, n in zip(layout, x.shape):
            sizes.setdefault(letter, n)
        expected = tuple(sizes[letter] for letter in layout)
        if tuple(x.shape) != expected:
            raise ValueError(f"{op}: {name} has shape {tuple(x.shape)}; expected {expected} {_dims(layout)}.")
    _check_dtypes(op, tensors)
    if first.device.type not in ("cuda", "cpu") or (first.device.type == "cpu" and not interpreting()):
        raise ValueError(f"{op}: inputs are on {first.device}; Triton kernels need a CUDA device "
                         "(or TRITON_INTERPRET=1 for CPU tensors).")
    sizes["N"] = sizes["B"]
    if cu_seqlens is not None:
        sizes["cu_seqlens"] = _check_cu_seqlens(op, cu_seqlens, sizes, first.device)
        sizes["N"] = len(sizes["cu_seqlens"]) - 1
        states = _per_sequence(states)
    if initial_state is not None:
        _check_states(op, initial_state, states, sizes, first.device)
    if sizes["T"] < 1:
        raise ValueError(f"{op}: the sequence is empty (T = 0); T must be at least 1.")
    return sizes


def _check_dtypes(op: str, tensors: dict):
    """One dtype for every input, except that a gate may be float32 beside 16-bit inputs."""
    given = {name: x.dtype for name, x in tensors.items() if x is not None}
    dtypes = {d for name, d in given.items() if not (name in GATE_INPUTS and d == torch.float32)}
    if len(dtypes) > 1:
        present = sorted(str(d) for d in set(given.values()))
        names = [name for name in given if name in GATE_INPUTS]
        label = "the gate" if len(names) == 1 else "the gates"
        also = f" (only {label}, {' and '.join(names)}, may be float32 beside 16-bit inputs)" if names else ""
        raise ValueError(f"{op}: inputs mix dtypes {present}; pass one dtype{also}.")


def _size(sizes: dict, letter: str) -> int:
    """The size a layout letter stands for: a digit is itself."""
    return int(letter) if letter.isdigit() else sizes[letter]


def _check_states(op: str, initial_state, states, sizes: dict, device):
    """`check_inputs` of a given initial_state: one tensor, or a tuple of them where `states`
    names several."""
    if isinstance(states, str):
        if not isinstance(initial_state, torch.Tensor):
            raise ValueError(f"{op}: initial_state must be a torch.Tensor or None.")
        pairs = [("initial_state", initial_state, states)]
    else:
        if not (isinstance(initial_state, (tuple, list)) and len(initial_state) == len(states)):
            parts = ", ".join(f"{name} {_dims(layout)}" for name, layout in states.items())
            kind = "a pair" if len(states) == 2 else "a tuple"
            raise ValueError(f"{op}: initial_state must be None or {kind} ({parts}).")
        pairs = [(f"initial_state {name}", s, layout)
                 for (name, layout), s in zip(states.items(), initial_state)]
    for label, s, layout in pairs:
        if not isinstance(s, torch.Tensor):
            raise ValueError(f"{op}: {label} must be a torch.Tensor, got {type(s).__name__}.")
        expected = tuple(_size(sizes, letter) for letter in layout)
        if tuple(s.shape) != expected:
            raise ValueError(f"{op}: {label} has shape {tuple(s.shape)}; "
                             f"expected {expected} {_dims(layout)}.")
        if s.device != device:
            raise ValueError(f"{op}: {label} is on {s.device} but the inputs are on {device}.")
        if s.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{op}: {label} has dtype {s.dtype}; expected float32.")


def _check_cu_seqlens(op: str, cu_seqlens, sizes: dict, device) -> tuple:
    """`check_inputs` of a packed batch's cu_seqlens: its values, read to the host once."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"{op}: cu_seqlens must be a torch.Tensor or None, got {type(cu_seqlens).__name__}.")
    if cu_seqlens.dim() != 1:
        raise ValueError(f"{op}: cu_seqlens must be a 1-D tensor [N + 1], got a {cu_seqlens.dim()}-D one.")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: cu_seqlens has dtype {cu_seqlens.dtype}; expected int32 or int64.")
    if cu_seqlens.device != device:
        raise ValueError(f"{op}: cu_seqlens is on {cu_seqlens.device} but the inputs are on {device}.")
    if sizes["B"] != 1:
        raise ValueError(f"{op}: with cu_seqlens the inputs must have B = 1 (the sequences packed "
                         f"along T), got B = {sizes['B']}.")
    values = tuple(cu_seqlens.tolist())
    if len(values) < 2:
        raise ValueError(f"{op}: cu_seqlens must hold N + 1 >= 2 values, got {len(values)}.")
    if values[0] != 0:
        raise ValueError(f"{op}: cu_seqlens must start at 0, got {values[0]}.")
    for i in range(1, len(values)):
        if values[i] <= values[i - 1]:
            raise ValueError(f"{op}: cu_seqlens must be strictly increasing (every sequence at least "
                             f"one token), got cu_seqlens[{i}] = {values[i]} after {values[i - 1]}.")
    if values[-1] != sizes["T"]:
        raise ValueError(f"{op}: cu_seqlens must end at T = {sizes['T']}, got {values[-1]}.")
    return values


def _per_sequence(states):
    """The layout(s) of initial_state in a packed batch: one state per sequence, B read as N."""
    if isinstance(states, str):
        return states.replace("B", "N")
    return {name: layout.replace("B", "N") for name, layout in states.items()}
