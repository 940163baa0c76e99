"""Linear attention, declared for the harness (harness/declaration.py says what each field means)."""
from harness.declaration import QKV, LayerSpec, OpSpec, OptionSpec, StateSpec, fla_layer, kernels

OP = OpSpec(
    name="linear_attn",
    description="S_t = S_{t-1} + k_t^T v_t; o_t = scale q_t S_t",
    inputs=QKV,
    variants=kernels("linear_attn", "chunk", "fused_chunk", "fused_recurrent"),
    layer=LayerSpec("fla_kernels.layers:LinearAttention", upstream=fla_layer("LinearAttention")),
    # fla normalises by default; these adapters pass normalize=False, the op defined here
    upstream={"fla": {v: f"harness.upstream:fla_{v}_linear_attn" for v in ("chunk", "fused_chunk", "fused_recurrent")}},
    # the normalised form divides by q_t . z_t, which only positive feature maps keep away from 0:
    # q and k are drawn as elu(x) + 1 under it
    options={"normalize": OptionSpec("o_t / (scale q_t . z_t + 1e-10), z_t the running key sum, a state",
                                     kwargs={"normalize": True}, states=(StateSpec("z", ("B", 1, "H", "K")),),
                                     kinds={"q": "positive", "k": "positive"})},
)
