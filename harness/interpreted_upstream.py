"""Upstream kernels under the Triton interpreter, on a machine without a GPU.

fla's kernels are written for a GPU, and two things stop them before the interpreter runs them:
their autotuners time each config through the GPU driver ("0 active drivers"), and releases
before 0.5 enter `torch.<device>.device(index)` around every call, which torch.cpu lacks.
`prepare()` gives each what it asks for: an autotuner keeps its first config untimed (the
interpreter's timings would mean nothing), and torch.cpu a `device` context that does nothing.
What a kernel computes is untouched, so its rows are as much its own as on a GPU."""
from __future__ import annotations

import contextlib
import os


def needed() -> bool:
    """Whether kernels here run in the interpreter with no GPU to time or guard them on."""
    import torch
    return os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()


def prepare() -> None:
    """Make upstream's autotuned, device-guarded calls run in the interpreter (where `needed`)."""
    if not needed():
        return
    import torch
    from triton.runtime.autotuner import Autotuner
    Autotuner.do_bench = property(lambda self: _untimed)
    if not hasattr(torch.cpu, "device"):
        torch.cpu.device = lambda index=None: contextlib.nullcontext()


def _untimed(kernel_call, quantiles=None) -> list[float]:
    """Every config takes no time, so the autotuner keeps its first; none is run to time it."""
    return [0.0] * len(quantiles or (None,))
