"""Kimi delta attention, declared for the harness (harness/declaration.py says what each field
means); inputs as the delta rule's, with log decays g [B, T, H, K] before beta; options the
delta rule's and beta from its logit (`GATED_OPTIONS`)."""
from fla_kernels.ops.delta_rule.declaration import BETA, GATED_OPTIONS, UNIT_QK, V
from harness.declaration import InputSpec, LayerSpec, OpSpec, fla, fla_layer, kernels

OP = OpSpec(
    name="kda",
    description="S_t = (I - beta_t k_t^T k_t) diag(exp(g_t)) S_{t-1} + beta_t k_t^T v_t; o_t = scale q_t S_t",
    inputs=UNIT_QK + (V, InputSpec("g", ("B", "T", "H", "K"), kind="gate"), BETA),
    variants=kernels("kda", "chunk", "fused_recurrent"),
    upstream=fla("kda", "chunk", "fused_recurrent"),
    options=GATED_OPTIONS,
    layer=LayerSpec("fla_kernels.layers:KimiDeltaAttention",
                    upstream=fla_layer("KimiDeltaAttention", by_head_dim=True)),
)
