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
# What the gated ops' calls also compute inside, as upstream's take them: beta from its logit
# (allow_neg_eigval: in (0, 2)), and gated_delta_rule's log decay from the layer's parameters
GATED_OPTIONS = {
    **OPTIONS,
    "use_beta_sigmoid_in_kernel": OptionSpec(
        "beta given as its logit: the step size is sigmoid(beta), taken by the call",
        kwargs={"use_beta_sigmoid_in_kernel": True}, kinds={"beta": "logit"}),
    "allow_neg_eigval": OptionSpec(
        "beta given as its logit and the step size 2 sigmoid(beta) in (0, 2): the update's "
        "eigenvalue 1 - beta |k|^2 down to -1",
        kwargs={"use_beta_sigmoid_in_kernel": True, "allow_neg_eigval": True}, kinds={"beta": "logit"}),
}
GATE_IN_CALL = OptionSpec(
    "the log decay computed by the call, -exp(A_log) softplus(g + dt_bias): g drawn raw, A_log and "
    "dt_bias [H] drawn as layers' parameters and passed by name",
    kwargs={"use_gate_in_kernel": True}, kinds={"g": "raw_gate"},
    inputs=(InputSpec("A_log", ("H",), kind="A_log", keyword=True),
            InputSpec("dt_bias", ("H",), kind="dt_bias", keyword=True)))

OP = OpSpec(
    name="delta_rule",
    description="S_t = (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t; o_t = scale q_t S_t",
    inputs=UNIT_QK + (V, BETA),
    variants=kernels("delta_rule", "chunk", "fused_recurrent"),
    upstream=fla("delta_rule", "chunk", "fused_recurrent"),
    options=OPTIONS,
    layer=LayerSpec("fla_kernels.layers:DeltaNet", upstream=fla_layer("DeltaNet")),
)
