"""Gated linear attention, declared for the harness (harness/declaration.py says what each field
means)."""
from harness.declaration import QKV, InputSpec, LayerSpec, OpSpec, fla, fla_layer, kernels

OP = OpSpec(
    name="gla",
    description="S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t; o_t = scale q_t S_t",
    inputs=QKV + (InputSpec("g", ("B", "T", "H", "K"), kind="gate"),),
    variants=kernels("gla", "chunk", "fused_chunk", "fused_recurrent"),
    layer=LayerSpec("fla_kernels.layers:GatedLinearAttention", upstream=fla_layer("GatedLinearAttention")),
    # fla's fused_chunk_gla is a stub that raises from 0.4.1 on (a SKIP row, harness.upstream.fitted)
    upstream=fla("gla", "chunk", "fused_chunk", "fused_recurrent"),
)
