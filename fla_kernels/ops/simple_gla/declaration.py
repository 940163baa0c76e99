"""Simple gated linear attention (one scalar decay per head and step), declared for the harness
(harness/declaration.py says what each field means)."""
from harness.declaration import QKV, InputSpec, OpSpec

OP = OpSpec(
    name="simple_gla",
    description="S_t = exp(g_t) S_{t-1} + k_t^T v_t (g per head); o_t = scale q_t S_t",
    inputs=QKV + (InputSpec("g", ("B", "T", "H"), kind="gate", optional=True),),
    variants={
        "chunk": "fla_kernels.ops.simple_gla:chunk_simple_gla",
        "fused_recurrent": "fla_kernels.ops.simple_gla:fused_recurrent_simple_gla",
    },
    reference_loop="references.simple_gla:simple_gla_recurrent",
    reference_chunked="references.simple_gla:simple_gla_chunked",
    upstream={"fla": {"chunk": "fla.ops.simple_gla:chunk_simple_gla",
                      "fused_recurrent": "fla.ops.simple_gla:fused_recurrent_simple_gla"}},
)
