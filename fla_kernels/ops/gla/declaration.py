"""Gated linear attention, declared for the harness (harness/declaration.py says what each field
means)."""
from harness.declaration import QKV, InputSpec, LayerSpec, OpSpec

OP = OpSpec(
    name="gla",
    description="S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t; o_t = scale q_t S_t",
    inputs=QKV + (InputSpec("g", ("B", "T", "H", "K"), kind="gate"),),
    variants={
        "chunk": "fla_kernels.ops.gla:chunk_gla",
        "fused_chunk": "fla_kernels.ops.gla:fused_chunk_gla",
        "fused_recurrent": "fla_kernels.ops.gla:fused_recurrent_gla",
    },
    reference_loop="references.gla:gla_recurrent",
    reference_chunked="references.gla:gla_chunked",
    layer=LayerSpec("fla_kernels.layers:GatedLinearAttention"),
    # fla's fused_chunk_gla is a stub that raises (deprecated upstream): no counterpart
    upstream={"fla": {"chunk": "fla.ops.gla:chunk_gla",
                      "fused_recurrent": "fla.ops.gla:fused_recurrent_gla"}},
)
