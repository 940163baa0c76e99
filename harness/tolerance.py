"""The tolerance policy: bound = factor * baseline error + floor_factor * floor + atol.

factor is 2 for outputs and states and 3 for gradients (flash-attention's convention);
floor_factor is 2, except in fp32 (below); atol only matters where the golden is (nearly)
zero. An op's exceptions go in its declaration (`tolerances`, one entry per (tensor, dtype),
each with the reason it exists); those of every op in OVERRIDES.

fp32 floor_factor 16 (8 units in the last place of max|X64|, about 1e-6 relative): the fp32
baseline sums its products pairwise (torch), while a Triton `tl.dot` accumulates serially;
where the baseline is only an ulp or two off the golden (T = 1, no state), a correct kernel
is up to ~8 ulps off (seen on the H100: dr at T=1, K=V=128, 7.6 ulps). Every real fp32 bug
class is orders of magnitude above that: tf32 products ~1e-3, a bf16 detour ~4e-3 relative.
Rounding errors of a sum over T steps add like a random walk, so beyond one chunk (64 steps)
the fp32 floor factor grows as sqrt(T / 64): without decay (linear attention) the three
variants of a correct op all sat at 30 floors at T = 1000 (1e-6 relative) while the pairwise
torch baseline sat at 5; at T = 43884 the allowance is ~2.5e-5 relative, still 20x under tf32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from harness.registry import OPS

DEFAULT_FACTOR = {"output": 2.0, "gradient": 3.0}
DEFAULT_ATOL = {"fp32": 1e-6, "fp16": 1e-5, "bf16": 1e-5}
DEFAULT_FLOOR_FACTOR = {"fp32": 16.0, "fp16": 2.0, "bf16": 2.0}
ACCUMULATION_CHUNK = 64   # fp32: the floor factor grows as sqrt(T / ACCUMULATION_CHUNK) beyond it

# ("*", tensor, dtype) -> {"factor" / "atol" / "floor_factor": ..., "reason": ...}, for every op;
# "*" matches any tensor or dtype too. An op's own exceptions are in its declaration.
OVERRIDES: dict = {}


def _overrides(op: str) -> dict:
    """OVERRIDES and the op's declared `tolerances`, keyed (op, tensor, dtype)."""
    declared = OPS[op].tolerances if op in OPS else {}
    return {**OVERRIDES, **{(op, tensor, dtype): fields for (tensor, dtype), fields in declared.items()}}


@dataclass(frozen=True)
class Tolerance:
    factor: float
    atol: float
    floor_factor: float = 2.0
    ROUNDING = 2.0   # of a floor factor, the final rounding's share; the rest is accumulation (fp32)

    def bound(self, base_err: float, floor: float) -> float:
        return self.factor * base_err + self.floor_factor * floor + self.atol

    def serial_share(self) -> float:
        """The floor factor's share beyond the final rounding: what the tolerance allows each
        element for serial accumulation (fp32); 0 where the floor factor is the rounding alone."""
        return max(self.floor_factor - self.ROUNDING, 0.0)

    def of_sum(self, floor: float, element_floor: float, terms: int) -> tuple["Tolerance", float]:
        """(tolerance, floor) of a sum of `terms` elements of the tensor, whose own rounding is
        `floor`: the bound takes the rounding share of the floor factor (final roundings are
        independent and have no sign), and the floor adds the serial-accumulation share once per
        term (a kernel that accumulates along t in fp32, as a gate gradient's suffix sums do,
        moves neighbouring elements' errors together, so a sum takes each term's allowance
        whole). Bound: factor * the baseline's error of the sum + rounding share * floor + atol."""
        rounding = min(self.floor_factor, self.ROUNDING)
        floor = floor + self.serial_share() * terms * element_floor / rounding
        return Tolerance(self.factor, self.atol, rounding), floor


def tolerance_for(op: str, tensor: str, dtype: str, T: int = 1, tensor_dtype: str | None = None) -> Tolerance:
    """The tolerance of one tensor of a case in `dtype` with T steps; the most specific override wins.

    The floor factor follows the dtype the tensor itself is returned in (`tensor_dtype`, default the
    case's): states are float32 in every case, and accumulate like any fp32 result.
    """
    kind = "gradient" if tensor.startswith("d") else "output"   # o and final states: "ht", "hkt", ...
    own = tensor_dtype or dtype
    floor_factor = DEFAULT_FLOOR_FACTOR[own]
    if own == "fp32":
        floor_factor *= math.sqrt(max(1.0, T / ACCUMULATION_CHUNK))
    fields = {"factor": DEFAULT_FACTOR[kind], "atol": DEFAULT_ATOL[dtype], "floor_factor": floor_factor}
    overrides = _overrides(op)
    for key in ((op, tensor, "*"), ("*", tensor, dtype), (op, "*", dtype), (op, tensor, dtype)):
        fields.update({k: v for k, v in overrides.get(key, {}).items() if k in fields})
    return Tolerance(**fields)
