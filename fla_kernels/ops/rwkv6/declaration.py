"""RWKV6 attention, declared for the harness (harness/declaration.py says what each field means)."""
from harness.declaration import InputSpec, LayerSpec, OpSpec

OP = OpSpec(
    name="rwkv6",
    description="S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t; o_t = scale r_t (S_{t-1} + diag(u) k_t^T v_t)",
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
    layer=LayerSpec("fla_kernels.layers:RWKV6Attention"),
    upstream={"fla": {"chunk": "fla.ops.rwkv6:chunk_rwkv6",
                      "fused_recurrent": "fla.ops.rwkv6:fused_recurrent_rwkv6"}},
)
