"""Gated slot attention, declared for the harness (harness/declaration.py says what each field
means). Its own shape symbol is M, the slots per head; g = None is the ungated form, where s sets
its own decay (fla_kernels/ops/gsa/gate.py)."""
from harness.declaration import (QKV, InputSpec, LayerSpec, OpSpec, OptionSpec, StateSpec, Symbol, fla,
                                 fla_layer, kernels)

OP = OpSpec(
    name="gsa",
    description="hk_t = hk_{t-1} diag(exp(g_t)) + k_t^T s_t; hv_t = diag(exp(g_t)) hv_{t-1} + s_t^T v_t; "
                "o_t = softmax(scale q_t hk_t) hv_t",
    inputs=QKV + (InputSpec("s", ("B", "T", "H", "M")),
                  InputSpec("g", ("B", "T", "H", "M"), kind="gate", optional=True)),
    states=(StateSpec("hk", ("B", "H", "K", "M")), StateSpec("hv", ("B", "H", "M", "V"))),
    symbols={"M": Symbol("slots per head",
                         presets={"cpu": (16,), "gpu": (16, 64), "long": (64,), "limits": (16,),
                                  "smoke": (16,)},
                         bench=64)},
    variants=kernels("gsa", "chunk", "fused_recurrent"),
    layer=LayerSpec("fla_kernels.layers:GatedSlotAttention", {"num_slots": "M"},
                    upstream=fla_layer("GatedSlotAttention", num_slots="M")),
    upstream=fla("gsa", "chunk", "fused_recurrent"),
    # its normaliser (the running logsumexp of s) starts afresh with each call: no chain of calls
    # through the final state equals one call
    options={"g=None": OptionSpec("the ungated form: s sets its own decay", without=("g",), chainable=False)},
)
