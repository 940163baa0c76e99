"""Simple gated linear attention (one scalar decay per head and step), declared for the harness
(harness/declaration.py says what each field means)."""
from harness.declaration import QKV, InputSpec, OpSpec, fla, kernels

OP = OpSpec(
    name="simple_gla",
    description="S_t = exp(g_t) S_{t-1} + k_t^T v_t (g per head); o_t = scale q_t S_t",
    inputs=QKV + (InputSpec("g", ("B", "T", "H"), kind="gate", optional=True),),
    variants=kernels("simple_gla", "chunk", "fused_recurrent"),
    upstream=fla("simple_gla", "chunk", "fused_recurrent"),
)
