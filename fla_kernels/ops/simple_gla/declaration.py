"""Simple gated linear attention (one scalar decay per head and step), declared for the harness
(harness/declaration.py says what each field means)."""
from harness.declaration import QKV, InputSpec, OpSpec, OptionSpec, fla, kernels

OP = OpSpec(
    name="simple_gla",
    description="S_t = exp(g_t) S_{t-1} + k_t^T v_t (g per head); o_t = scale q_t S_t",
    inputs=QKV + (InputSpec("g", ("B", "T", "H"), kind="gate", optional=True),),
    variants=kernels("simple_gla", "chunk", "fused_recurrent"),
    upstream=fla("simple_gla", "chunk", "fused_recurrent"),
    options={"g_gamma": OptionSpec("a constant log decay per head in place of g (no gradient, as upstream)",
                                   inputs=(InputSpec("g_gamma", ("H",), kind="gate", grad=False),),
                                   without=("g",))},
)
