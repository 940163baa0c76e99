"""The gated delta rule, declared for the harness (harness/declaration.py says what each field
means); inputs as the delta rule's, with the log decay g [B, T, H] before beta; options as
kda's, and the log decay computed by the call from the layer's A_log and dt_bias."""
from fla_kernels.ops.delta_rule.declaration import BETA, GATE_IN_CALL, GATED_OPTIONS, UNIT_QK, V
from harness.declaration import InputSpec, LayerSpec, OpSpec, fla, fla_layer, kernels

OP = OpSpec(
    name="gated_delta_rule",
    description="S_t = exp(g_t) (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t; o_t = scale q_t S_t",
    inputs=UNIT_QK + (V, InputSpec("g", ("B", "T", "H"), kind="gate"), BETA),
    variants=kernels("gated_delta_rule", "chunk", "fused_recurrent"),
    # fla's fused_recurrent_gated_delta_rule takes gk and gv between g and beta: fitted to its
    # signature, beta goes by keyword (harness.upstream.fitted)
    upstream=fla("gated_delta_rule", "chunk", "fused_recurrent"),
    options={**GATED_OPTIONS, "use_gate_in_kernel": GATE_IN_CALL},
    layer=LayerSpec("fla_kernels.layers:GatedDeltaNet", upstream=fla_layer("GatedDeltaNet", by_head_dim=True)),
)
