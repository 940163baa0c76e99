"""The tolerance policy: bound = factor * baseline error + 2 * floor + atol.

factor is 2 for outputs and states and 3 for gradients (flash-attention's convention);
atol only matters where the golden is (nearly) zero. Exceptions go in OVERRIDES, one
declarative entry per (op, tensor, dtype), each with the reason it exists.
"""
from __future__ import annotations

from dataclasses import dataclass

OUTPUT_TENSORS = ("o", "ht")
DEFAULT_FACTOR = {"output": 2.0, "gradient": 3.0}
DEFAULT_ATOL = {"fp32": 1e-6, "fp16": 1e-5, "bf16": 1e-5}
FLOOR_FACTOR = 2.0

# (op, tensor, dtype) -> {"factor": ..., "atol": ..., "reason": ...}; "*" matches anything.
OVERRIDES: dict = {}


@dataclass(frozen=True)
class Tolerance:
    factor: float
    atol: float
    floor_factor: float = FLOOR_FACTOR

    def bound(self, base_err: float, floor: float) -> float:
        return self.factor * base_err + self.floor_factor * floor + self.atol


def tolerance_for(op: str, tensor: str, dtype: str) -> Tolerance:
    """The tolerance of one tensor; the most specific override wins."""
    kind = "output" if tensor in OUTPUT_TENSORS else "gradient"
    fields = {"factor": DEFAULT_FACTOR[kind], "atol": DEFAULT_ATOL[dtype]}
    for key in ((op, tensor, "*"), ("*", tensor, dtype), (op, "*", dtype), (op, tensor, dtype)):
        fields.update({k: v for k, v in OVERRIDES.get(key, {}).items() if k in ("factor", "atol")})
    return Tolerance(**fields)
