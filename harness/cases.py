"""Cases (one point of a sweep) and presets (the grids a sweep expands)."""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import torch

from harness.declaration import CORE_SYMBOLS
from reports.schema import SHAPE

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
# mixed dtypes the library takes and layers produce: name -> (the activations', the gates' dtype)
MIXED_DTYPES = {"bf16-fp32gates": ("bf16", "fp32"), "fp16-fp32gates": ("fp16", "fp32")}
DTYPE_CHOICES = (*DTYPES, *MIXED_DTYPES)
# a log gate is logsigmoid(randn) / GATES[gate] (a log decay <= 0); "extreme" sets every gate to
# EXTREME_GATE instead: a 64-step chunk's gate sum reaches -3840, where exp underflows in any dtype
GATES = {"normal": 1.0, "strong": 0.05, "weak": 16.0, "extreme": None}
EXTREME_GATE = -60.0
H0_OPTIONS = ("none", "random", "grad")   # no initial state / given / given and requiring grad
# "packed": the case's B * T tokens as sequences of unequal lengths in one row (`harness/packing.py`)
VARLEN = ("none", "packed")
OWN_SYMBOLS = tuple(s for s in SHAPE if s not in CORE_SYMBOLS)   # ops' own symbols, 0 where unused


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
    M: int = 0    # one field per OWN_SYMBOLS
    varlen: str = "none"   # one of VARLEN
    option: str = "none"   # the op's option (`OpSpec.all_options`), "none" for its core call

    @property
    def case_id(self) -> str:
        own = "".join(f"-{s}{getattr(self, s)}" for s in OWN_SYMBOLS if getattr(self, s))
        call = "".join(f"-{v}" for v in (self.varlen, self.option) if v != "none")
        return (f"{self.op}-{self.dtype}-B{self.B}-T{self.T}-H{self.H}-K{self.K}-V{self.V}{own}"
                f"-h0_{self.h0}-{self.gate}-s{self.seed}{call}")

    @property
    def activation_dtype(self) -> str:
        """The dtype of q, k, v and the output ("bf16" of "bf16-fp32gates")."""
        return MIXED_DTYPES[self.dtype][0] if self.dtype in MIXED_DTYPES else self.dtype

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.activation_dtype]

    @property
    def gate_dtype(self) -> torch.dtype:
        """The dtype of the log gates: the activations' unless the dtype mixes them."""
        return DTYPES[MIXED_DTYPES[self.dtype][1]] if self.dtype in MIXED_DTYPES else self.torch_dtype

    @property
    def packed(self) -> bool:
        return self.varlen == "packed"

    def dims(self) -> dict:
        return {s: getattr(self, s) for s in SHAPE}

    def as_dict(self) -> dict:
        return asdict(self)


# Axes of each preset (or of each of its "grids"); "KV" pairs head dims (8 and sizes that are not powers of two, below 16
# where `tl.dot` stops, as users' heads are); T = 1 with H > 1 is a decode step. A sweep is the
# product of the axes; every preset calls the op's core call on unpacked batches ("varlen" and
# "option" are "none") unless a sweep asks for more.
PRESETS = {
    "cpu": {
        "description": "small shapes for the Triton interpreter (default without a GPU)",
        "B": [1], "T": [1, 65], "H": [2], "KV": [(16, 16), (12, 20), (8, 8)],
        "h0": ["none", "grad"], "gate": ["normal", "strong"],
    },
    "gpu": {
        "description": "the GPU grid (default with a GPU)",
        "B": [2], "T": [1, 63, 64, 65, 1000, 4096, 43884], "H": [1, 4],
        "KV": [(64, 64), (64, 16), (128, 128), (60, 60), (8, 8), (24, 48), (48, 24), (100, 100),
               (256, 256)],
        "h0": ["none", "grad"], "gate": ["normal", "strong"],
    },
    "long": {
        "description": "long sequences (golden from the chunked float64 form)",
        "B": [1], "T": [16384, 43884, 65536], "H": [1], "KV": [(64, 64)],
        "h0": ["none", "grad"], "gate": ["normal", "strong"],
    },
    "limits": {
        "description": "GPU: past the hardware's limits: more than 65535 programs on a grid axis (B x H, "
                       "N x H packed), flat offsets past 2^31 elements (chunk states; golden on a sample)",
        "grids": [
            {"B": [4096], "T": [32], "H": [32], "KV": [(16, 16)], "h0": ["grad"], "gate": ["normal"]},
            {"B": [16], "T": [65536], "H": [8], "KV": [(128, 128)], "h0": ["grad"], "gate": ["normal"]},
        ],
    },
    "smoke": {
        "description": "one tiny case, to see that everything runs",
        "B": [1], "T": [17], "H": [1], "KV": [(16, 16)], "h0": ["grad"], "gate": ["normal"],
    },
}
AXES = ("B", "T", "H", "KV", "h0", "gate", "varlen", "option")
CALL_AXES = {"varlen": ["none"], "option": ["none"]}   # every preset's


def default_preset() -> str:
    return "gpu" if torch.cuda.is_available() else "cpu"


def expand(spec, dtypes, preset: str, overrides: dict, seed: int) -> list[Case]:
    """The cases of `preset` for the op `spec` and each dtype, with axes replaced by `overrides`.

    The op's own shape symbols (gsa's M) take the values its declaration gives the preset; the
    other ops record 0 for them. Of the options asked for, each op takes those it has.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; known presets: {', '.join(PRESETS)}.")
    cases = []
    for grid in PRESETS[preset].get("grids", [PRESETS[preset]]):
        axes = {a: grid.get(a, CALL_AXES.get(a)) for a in AXES}
        axes.update({name: symbol.presets[preset] for name, symbol in spec.symbols.items()})
        axes.update({a: v for a, v in overrides.items() if v and a in axes})
        axes["option"] = [o for o in axes["option"] if o == "none" or o in spec.all_options()]
        names = list(axes)
        for dtype in dtypes:
            for values in itertools.product(*axes.values()):
                point = dict(zip(names, values))
                K, V = point.pop("KV")
                cases.append(Case(op=spec.name, dtype=dtype, K=K, V=V, seed=seed, **point))
    return cases
