"""Cases (one point of a sweep) and presets (the grids a sweep expands)."""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
GATES = {"normal": 1.0, "strong": 0.05, "weak": 16.0}
H0_OPTIONS = ("none", "random", "grad")   # no initial state / given / given and requiring grad


@dataclass(frozen=True)
class Case:
    op: str
    dtype: str
    B: int
    T: int
    H: int
    K: int
    V: int
    h0: str
    gate: str
    seed: int
    M: int = 0

    @property
    def case_id(self) -> str:
        m = f"-M{self.M}" if self.M else ""
        return (f"{self.op}-{self.dtype}-B{self.B}-T{self.T}-H{self.H}-K{self.K}-V{self.V}{m}"
                f"-h0_{self.h0}-{self.gate}-s{self.seed}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def dims(self) -> dict:
        return {"B": self.B, "T": self.T, "H": self.H, "K": self.K, "V": self.V, "M": self.M}

    def as_dict(self) -> dict:
        return asdict(self)


# Axes of each preset; "KV" pairs head dims. A sweep is the product of the axes.
PRESETS = {
    "cpu": {
        "description": "small shapes for the Triton interpreter (default without a GPU)",
        "B": [1], "T": [1, 65], "H": [2], "KV": [(16, 16), (12, 20)],
        "h0": ["none", "grad"], "gate": ["normal", "strong"], "M": [16],
    },
    "gpu": {
        "description": "the GPU grid (default with a GPU)",
        "B": [2], "T": [1, 63, 64, 65, 1000, 4096, 43884], "H": [1, 4],
        "KV": [(64, 64), (64, 16), (128, 128), (60, 60)],
        "h0": ["none", "grad"], "gate": ["normal", "strong"], "M": [16, 64],
    },
    "long": {
        "description": "long sequences (golden from the chunked float64 form)",
        "B": [1], "T": [16384, 43884, 65536], "H": [1], "KV": [(64, 64)],
        "h0": ["none", "grad"], "gate": ["normal", "strong"], "M": [64],
    },
    "smoke": {
        "description": "one tiny case, to see that everything runs",
        "B": [1], "T": [17], "H": [1], "KV": [(16, 16)], "h0": ["grad"], "gate": ["normal"], "M": [16],
    },
}
AXES = ("B", "T", "H", "KV", "h0", "gate", "M")


def default_preset() -> str:
    return "gpu" if torch.cuda.is_available() else "cpu"


def expand(op: str, dtypes, preset: str, overrides: dict, seed: int, uses_slots: bool = False) -> list[Case]:
    """The cases of `preset` for `op` and each dtype, with axes replaced by `overrides`.

    The slot axis M applies only to ops with slots (`uses_slots`); the others get M = 0.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; known presets: {', '.join(PRESETS)}.")
    axes = {a: PRESETS[preset][a] for a in AXES}
    axes.update({a: v for a, v in overrides.items() if v})
    if not uses_slots:
        axes["M"] = [0]
    cases = []
    for dtype in dtypes:
        for B, T, H, (K, V), h0, gate, M in itertools.product(*(axes[a] for a in AXES)):
            cases.append(Case(op=op, dtype=dtype, B=B, T=T, H=H, K=K, V=V, h0=h0, gate=gate, seed=seed, M=M))
    return cases
