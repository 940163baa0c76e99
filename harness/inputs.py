"""Seeded inputs in the target dtype, and the upstream gradients every implementation shares."""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.cases import EXTREME_GATE, GATES, Case
from harness.declaration import GATE_KINDS, OpSpec
from harness.packing import cu_seqlens_of, sequence_count, sequence_lengths


@dataclass
class CaseInputs:
    tensors: dict            # name -> tensor in the case dtype (positional inputs of the op)
    initial_states: tuple    # float32 tensors, one per state of the op, or None
    do: torch.Tensor         # upstream gradient of o, case dtype
    dhts: tuple              # upstream gradients of the final states, float32
    scale: float | None      # None: the implementation's default (K ** -0.5)
    dims: dict = None        # the sizes of the call: the case's, or B = 1 and T = B * T when packed
    state_dims: dict = None  # the sizes of the states: `dims` with B the number of sequences
    cu_seqlens: torch.Tensor | None = None   # int32 [N + 1] sequence starts of a packed case

    @property
    def bounds(self) -> list[int] | None:
        """The packed sequences' starts and the end, or None (not packed)."""
        return None if self.cu_seqlens is None else self.cu_seqlens.tolist()

    @property
    def longest(self) -> int:
        """The longest sequence's length: T, or the longest packed sequence's."""
        bounds = self.bounds
        return self.dims["T"] if bounds is None else max(b - a for a, b in zip(bounds, bounds[1:]))


def _generator(case: Case) -> torch.Generator:
    """A CPU generator seeded by the recorded seed and the case's shape, so inputs are device-independent."""
    key = f"{case.seed}-{case.B}-{case.T}-{case.H}-{case.K}-{case.V}-{case.M}-{case.dtype}-{case.gate}"
    return torch.Generator().manual_seed(zlib.crc32(key.encode()))


def of_kind(x: torch.Tensor, kind: str, strength: float | None) -> torch.Tensor:
    """A standard normal draw x made an input of `kind` (`InputSpec.kind`) under the gate
    strength's normaliser (`GATES`; None: "extreme"):
    - "randn": x itself;
    - "gate": the log decay logsigmoid(x) / strength (every gate EXTREME_GATE when extreme);
    - "positive": elu(x) + 1, a positive feature map's output;
    - "unit": x divided by its L2 norm over the last dimension, as layers normalise keys;
    - "beta": the delta rule's step size sigmoid(x / strength) in (0, 1): spread around 1/2
      (normal), close to 1/2 (weak), most of it within 1e-4 of 0 or 1 (strong: the state nearly
      kept or nearly overwritten), and exactly 1 or ~1e-26 (extreme, the sign of x);
    - "logit": that step size's logit, for a call that takes the sigmoid itself;
    - a gate the call computes as -exp(A_log) * softplus(g + dt_bias), as upstream layers'
      parameters give it: "raw_gate", x itself (a projection's output); "dt_bias",
      log(expm1(dt)) with dt log-uniform in (0.001, 0.1); "A_log", log(A) with A uniform in
      (1, 16) over the normaliser (extreme: A = 1e6, every decay near EXTREME_GATE or below)."""
    if kind == "gate":
        return torch.full_like(x, EXTREME_GATE) if strength is None else F.logsigmoid(x) / strength
    if kind == "positive":
        return F.elu(x) + 1
    if kind == "unit":
        return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    if kind in ("beta", "logit"):
        logit = torch.sign(x) * -EXTREME_GATE if strength is None else x / strength
        return torch.sigmoid(logit) if kind == "beta" else logit
    if kind == "dt_bias":   # ndtr: the normal's CDF, so ndtr(x) is uniform in (0, 1)
        return torch.log(torch.expm1(torch.exp(math.log(1e-3) + torch.special.ndtr(x) * math.log(100.0))))
    if kind == "A_log":
        return (torch.full_like(x, math.log(1e6)) if strength is None
                else torch.log((1 + 15 * torch.special.ndtr(x)) / strength))
    return x


def packed_lengths(case: Case, gen: torch.Generator | None = None) -> list[int]:
    """The sequence lengths of a packed case (`sequence_lengths`), from a generator of their own
    seeded from the case's (or `gen`'s), so the tensors drawn are the unpacked case's in one row."""
    own = torch.Generator().manual_seed((_generator(case) if gen is None else gen).initial_seed() + 1)
    return sequence_lengths(case.B * case.T, sequence_count(case.B, own), own)


def make_inputs(spec: OpSpec, case: Case, device, generator: torch.Generator | None = None) -> CaseInputs:
    """Draw every input in float32 on the CPU, round it to the case dtype (gates to the gates'
    dtype), move it to `device`: the inputs in call order, the initial states (unless case.h0 is
    "none"), do, the dhts, then the inputs the case's option adds and, for a packed case, the
    sequence lengths (so the core inputs are the same numbers under every option and packing).
    `generator`: the CPU generator to draw from (default: the case's own, `_generator`)."""
    spec = spec.under(case.option)
    gen = _generator(case) if generator is None else generator
    dims = case.dims()
    if case.packed:
        dims.update(B=1, T=case.B * case.T)

    def draw(shape, kind="randn"):
        x = of_kind(torch.randn(shape, generator=gen, dtype=torch.float32), kind, GATES[case.gate])
        return x.to(case.gate_dtype if kind in GATE_KINDS else case.torch_dtype).to(device)

    extra = spec.option_spec()
    tensors = {s.name: draw(spec.shape_of(s, dims), s.kind) for s in spec.inputs if s not in extra.inputs}
    lengths = packed_lengths(case, gen) if case.packed else []
    state_dims = {**dims, "B": len(lengths)} if case.packed else dims
    core_states = [s for s in spec.states if s not in extra.states]

    def states(specs):
        return [torch.randn(spec.shape_of(s, state_dims), generator=gen, dtype=torch.float32).to(device)
                for s in specs]

    h0 = states(core_states) if case.h0 != "none" else None
    do = draw((dims["B"], dims["T"], case.H, case.V))
    dhts = states(core_states)
    tensors.update({s.name: draw(spec.shape_of(s, dims), s.kind) for s in extra.inputs})
    h0 = None if h0 is None else tuple(h0 + states(extra.states))
    dhts = tuple(dhts + states(extra.states))
    tensors = {s.name: tensors[s.name] for s in spec.inputs}
    return CaseInputs(tensors=tensors, initial_states=h0, do=do, dhts=dhts, scale=case.K ** -0.5,
                      dims=dims, state_dims=state_dims,
                      cu_seqlens=cu_seqlens_of(lengths, device) if case.packed else None)
