"""Seeded inputs in the target dtype, and the upstream gradients every implementation shares."""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.cases import EXTREME_GATE, GATES, Case
from harness.declaration import OpSpec


@dataclass
class CaseInputs:
    tensors: dict            # name -> tensor in the case dtype (positional inputs of the op)
    initial_states: tuple    # float32 tensors, one per state of the op, or None
    do: torch.Tensor         # upstream gradient of o, case dtype
    dhts: tuple              # upstream gradients of the final states, float32
    scale: float | None      # None: the implementation's default (K ** -0.5)


def _generator(case: Case) -> torch.Generator:
    """A CPU generator seeded by the recorded seed and the case's shape, so inputs are device-independent."""
    key = f"{case.seed}-{case.B}-{case.T}-{case.H}-{case.K}-{case.V}-{case.M}-{case.dtype}-{case.gate}"
    return torch.Generator().manual_seed(zlib.crc32(key.encode()))


def make_inputs(spec: OpSpec, case: Case, device, generator: torch.Generator | None = None) -> CaseInputs:
    """Draw every input in float32 on the CPU, round it to the case dtype, move it to `device`:
    the inputs in call order, the initial states (unless case.h0 is "none"), do, the dhts.
    `generator`: the CPU generator to draw from (default: the case's own, `_generator`)."""
    gen = _generator(case) if generator is None else generator
    dims = case.dims()
    dtype = case.torch_dtype

    def draw(shape, kind="randn"):
        x = torch.randn(shape, generator=gen, dtype=torch.float32)
        if kind == "gate":
            x = torch.full_like(x, EXTREME_GATE) if GATES[case.gate] is None else F.logsigmoid(x) / GATES[case.gate]
        return x.to(dtype).to(device)

    tensors = {s.name: draw(spec.shape_of(s, dims), s.kind) for s in spec.inputs}
    state_shapes = [tuple(dims[d] for d in s.shape) for s in spec.states]
    h0 = None
    if case.h0 != "none":
        h0 = tuple(torch.randn(shape, generator=gen, dtype=torch.float32).to(device) for shape in state_shapes)
    do = draw((case.B, case.T, case.H, case.V))
    dhts = tuple(torch.randn(shape, generator=gen, dtype=torch.float32).to(device) for shape in state_shapes)
    return CaseInputs(tensors=tensors, initial_states=h0, do=do, dhts=dhts, scale=case.K ** -0.5)
