"""RWKV6 attention, declared for the harness (harness/declaration.py says what each field means)."""
from harness.declaration import InputSpec, LayerSpec, OpSpec, fla, fla_layer, kernels

OP = OpSpec(
    name="rwkv6",
    description="S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t; o_t = scale r_t (S_{t-1} + diag(u) k_t^T v_t)",
    inputs=tuple(InputSpec(n, ("B", "T", "H", d)) for n, d in (("r", "K"), ("k", "K"), ("v", "V")))
    + (InputSpec("w", ("B", "T", "H", "K"), kind="gate"), InputSpec("u", ("H", "K"))),
    variants=kernels("rwkv6", "chunk", "fused_recurrent"),
    layer=LayerSpec("fla_kernels.layers:RWKV6Attention", upstream=fla_layer("RWKV6Attention")),
    upstream=fla("rwkv6", "chunk", "fused_recurrent"),
)
