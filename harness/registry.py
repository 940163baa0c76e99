"""The op registry: what each op takes, which variants implement it, and its references.

Adding an op family means adding one `OpSpec` here, its kernels and its references.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class InputSpec:
    """One input tensor: its name and shape in terms of the case's B, T, H, K, V, M."""
    name: str
    shape: tuple          # symbols among "B", "T", "H", "K", "V", "M"
    kind: str = "randn"   # "randn" or "gate" (log gate: logsigmoid(randn) / normaliser)
    optional: bool = False  # the op also accepts None here (its gradient is then None)


@dataclass(frozen=True)
class StateSpec:
    """One recurrent state: its name ("h" gives tensors "ht" and "dh0") and shape symbols."""
    name: str
    shape: tuple


@dataclass(frozen=True)
class OpSpec:
    name: str
    inputs: tuple                     # InputSpec, in positional order of the public functions
    variants: dict                    # variant -> "module:function"
    reference_loop: str               # "module:function", the float64 definition
    reference_chunked: str            # "module:function", same numbers, fast for long T
    states: tuple = (StateSpec("h", ("B", "H", "K", "V")),)   # more than one: passed as tuples
    loop_max_T: int = 256             # above this the golden comes from the chunked form
    baseline_chunk_size: int = 64     # the chunk of the same-dtype baseline: production kernels' size
    description: str = ""
    presets: dict = field(default_factory=dict)

    def variant_fn(self, variant: str) -> Callable:
        return load_function(self.variants[variant])

    def shape_of(self, spec: InputSpec, dims: dict) -> tuple:
        return tuple(dims[s] for s in spec.shape)

    @property
    def uses_slots(self) -> bool:
        return any("M" in s.shape for s in self.inputs)

    def final_state_names(self) -> list:
        return [s.name + "t" for s in self.states]

    def initial_state_grad_names(self) -> list:
        return ["d" + s.name + "0" for s in self.states]


def load_function(target: str) -> Callable:
    """Import 'package.module:function'; raise ValueError with a plain sentence if it cannot."""
    if target.count(":") != 1:
        raise ValueError(f"'{target}' is not of the form module:function.")
    module_name, fn_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module '{module_name}': {exc}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ValueError(f"module '{module_name}' has no function '{fn_name}'.")
    return fn


RWKV6 = OpSpec(
    name="rwkv6",
    inputs=(
        InputSpec("r", ("B", "T", "H", "K")),
        InputSpec("k", ("B", "T", "H", "K")),
        InputSpec("v", ("B", "T", "H", "V")),
        InputSpec("w", ("B", "T", "H", "K"), kind="gate"),
        InputSpec("u", ("H", "K")),
    ),
    variants={
        "chunk": "fla_kernels.ops.rwkv6:chunk_rwkv6",
        "fused_recurrent": "fla_kernels.ops.rwkv6:fused_recurrent_rwkv6",
    },
    reference_loop="references.rwkv6:rwkv6_recurrent",
    reference_chunked="references.rwkv6:rwkv6_chunked",
    description="S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t; o_t = scale r_t (S_{t-1} + diag(u) k_t^T v_t)",
)

QKV = (InputSpec("q", ("B", "T", "H", "K")), InputSpec("k", ("B", "T", "H", "K")),
       InputSpec("v", ("B", "T", "H", "V")))

LINEAR_ATTN = OpSpec(
    name="linear_attn",
    inputs=QKV,
    variants={
        "chunk": "fla_kernels.ops.linear_attn:chunk_linear_attn",
        "fused_chunk": "fla_kernels.ops.linear_attn:fused_chunk_linear_attn",
        "fused_recurrent": "fla_kernels.ops.linear_attn:fused_recurrent_linear_attn",
    },
    reference_loop="references.linear_attn:linear_attn_recurrent",
    reference_chunked="references.linear_attn:linear_attn_chunked",
    description="S_t = S_{t-1} + k_t^T v_t; o_t = scale q_t S_t",
)

SIMPLE_GLA = OpSpec(
    name="simple_gla",
    inputs=QKV + (InputSpec("g", ("B", "T", "H"), kind="gate", optional=True),),
    variants={
        "chunk": "fla_kernels.ops.simple_gla:chunk_simple_gla",
        "fused_recurrent": "fla_kernels.ops.simple_gla:fused_recurrent_simple_gla",
    },
    reference_loop="references.simple_gla:simple_gla_recurrent",
    reference_chunked="references.simple_gla:simple_gla_chunked",
    description="S_t = exp(g_t) S_{t-1} + k_t^T v_t (g per head); o_t = scale q_t S_t",
)

GLA = OpSpec(
    name="gla",
    inputs=QKV + (InputSpec("g", ("B", "T", "H", "K"), kind="gate"),),
    variants={
        "chunk": "fla_kernels.ops.gla:chunk_gla",
        "fused_chunk": "fla_kernels.ops.gla:fused_chunk_gla",
        "fused_recurrent": "fla_kernels.ops.gla:fused_recurrent_gla",
    },
    reference_loop="references.gla:gla_recurrent",
    reference_chunked="references.gla:gla_chunked",
    description="S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t; o_t = scale q_t S_t",
)

GSA = OpSpec(
    name="gsa",
    inputs=QKV + (InputSpec("s", ("B", "T", "H", "M")), InputSpec("g", ("B", "T", "H", "M"), kind="gate")),
    variants={
        "chunk": "fla_kernels.ops.gsa:chunk_gsa",
        "fused_recurrent": "fla_kernels.ops.gsa:fused_recurrent_gsa",
    },
    reference_loop="references.gsa:gsa_recurrent",
    reference_chunked="references.gsa:gsa_chunked",
    states=(StateSpec("hk", ("B", "H", "K", "M")), StateSpec("hv", ("B", "H", "M", "V"))),
    description="hk_t = hk_{t-1} diag(exp(g_t)) + k_t^T s_t; hv_t = diag(exp(g_t)) hv_{t-1} + s_t^T v_t; "
                "o_t = softmax(scale q_t hk_t) hv_t",
)

OPS = {spec.name: spec for spec in (LINEAR_ATTN, SIMPLE_GLA, GLA, RWKV6, GSA)}


def get_op(name: str) -> OpSpec:
    if name not in OPS:
        raise ValueError(f"unknown op '{name}'; known ops: {', '.join(sorted(OPS))}.")
    return OPS[name]
