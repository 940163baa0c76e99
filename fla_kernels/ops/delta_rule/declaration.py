"""The delta rule, declared for the harness (harness/declaration.py says what each field means).
The family's shared inputs and option are declared here; gated_delta_rule and kda take them.

Keys and queries are drawn L2-normalised, as the family's layers give them (the update is a
contraction only for |k| <= 1 with beta in (0, 1)); beta is drawn by the gate-strength axis
(harness/inputs.py:of_kind). use_qk_l2norm_in_kernel draws them unnormalised for the kernel to
normalise."""
from harness.declaration import InputSpec, LayerSpec, OpSpec, OptionSpec, fla, fla_layer, kernels

UNIT_QK = (InputSpec("q", ("B", "T", "H", "K"), kind="unit"), InputSpec("k", ("B", "T", "H", "K"), kind="unit"))
V = InputSpec("v", ("B", "T", "H", "V"))
BETA = InputSpec("beta", ("B", "T", "H"), kind="beta")
OPTIONS = {"use_qk_l2norm_in_kernel": OptionSpec(
    "q and k L2-normalised by the call (x / sqrt(sum x^2 + 1e-6)), drawn unnormalised",
    kwargs={"use_qk_l2norm_in_kernel": True}, kinds={"q": "randn", "k": "randn"})}

OP = OpSpec(
    name="delta_rule",
    description="S_t = (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t; o_t = scale q_t S_t",
    inputs=UNIT_QK + (V, BETA),
    variants=kernels("delta_rule", "chunk", "fused_recurrent"),
    upstream=fla("delta_rule", "chunk", "fused_recurrent"),
    options=OPTIONS,
    layer=LayerSpec("fla_kernels.layers:DeltaNet", upstream=fla_layer("DeltaNet")),
)
