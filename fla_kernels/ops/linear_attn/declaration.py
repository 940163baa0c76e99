"""Linear attention, declared for the harness (harness/declaration.py says what each field means)."""
from harness.declaration import QKV, LayerSpec, OpSpec

OP = OpSpec(
    name="linear_attn",
    description="S_t = S_{t-1} + k_t^T v_t; o_t = scale q_t S_t",
    inputs=QKV,
    variants={
        "chunk": "fla_kernels.ops.linear_attn:chunk_linear_attn",
        "fused_chunk": "fla_kernels.ops.linear_attn:fused_chunk_linear_attn",
        "fused_recurrent": "fla_kernels.ops.linear_attn:fused_recurrent_linear_attn",
    },
    reference_loop="references.linear_attn:linear_attn_recurrent",
    reference_chunked="references.linear_attn:linear_attn_chunked",
    layer=LayerSpec("fla_kernels.layers:LinearAttention"),
    # fla normalises by default; the adapters pass normalize=False, the op defined here
    upstream={"fla": {"chunk": "harness.upstream:fla_chunk_linear_attn",
                      "fused_chunk": "harness.upstream:fla_fused_chunk_linear_attn",
                      "fused_recurrent": "harness.upstream:fla_fused_recurrent_linear_attn"}},
)
