"""The token-by-token family (fused_recurrent_gla, fused_recurrent_simple_gla, fused_recurrent_linear_attn:
one kernel set, ops/common/fused_recurrent.py) against the float64 recurrent references.

CPU: Triton interpreter. Inputs, runner, reference and assertions come from tests/kernel_testing.py.
Bounds: max|X - X64| <= REL_TOL[dtype] * max|X64| for every tensor (dg included: the kernels leave
the gate-free terms out of the gate-gradient sums, so fp32 dg keeps 1e-5 under strong decay), and
fp16 / bf16 results, computed in fp32 and rounded once, within half an ulp of the float64 value.
"""
import pytest
import torch

from fla_kernels.ops.common.fused_recurrent import CHUNK
from fla_kernels.ops.gla.fused_recurrent import fused_recurrent_gla
from fla_kernels.ops.linear_attn.fused_recurrent import fused_recurrent_linear_attn
from fla_kernels.ops.simple_gla.fused_recurrent import fused_recurrent_simple_gla
from harness.registry import get_op
from tests.kernel_testing import (DEVICE, REL_TOL, assert_close, assert_identical,
                                  assert_matches_reference, assert_unchanged, make_inputs, reference, run,
                                  segmented)

GLA, SIMPLE_GLA, LINEAR_ATTN = get_op("gla"), get_op("simple_gla"), get_op("linear_attn")

OPS = {"gla": (GLA, fused_recurrent_gla), "simple_gla": (SIMPLE_GLA, fused_recurrent_simple_gla),
       "linear_attn": (LINEAR_ATTN, fused_recurrent_linear_attn)}

def _ids(p):
    return str(p).replace("torch.", "") if not isinstance(p, bool) else str(p)


CASES = [
    # dtype, gate, B, T, H, K, V, initial state, output_final_state
    (torch.float32, "strong", 2, 1, 1, 8, 16, False, True),            # dg exactly 0: gate-free terms
    (torch.float32, "normal", 1, 1, 2, 16, 8, True, True),
    (torch.float32, "strong", 1, CHUNK - 1, 1, 8, 16, False, False),
    (torch.float32, "normal", 1, CHUNK + 1, 2, 60, 20, True, True),    # K non-power of 2, K != V
    (torch.float32, "extreme", 1, CHUNK, 1, 16, 8, True, True),
    (torch.float32, "strong", 1, 2 * CHUNK + 2, 1, 8, 8, True, True),    # three chunks
    (torch.float32, "normal", 1, 9, 1, 16, 40, True, True),              # two V-blocks
    (torch.bfloat16, "strong", 1, CHUNK + 1, 1, 32, 16, True, True),
    (torch.float16, "normal", 1, 37, 1, 16, 16, True, False),
]
# the gate strength means nothing without a gate: linear attention runs the normal-gate cases
PARAMS = [pytest.param(op, *case, id="-".join([op] + [_ids(p) for p in case]))
          for op in OPS for case in CASES if op != "linear_attn" or case[1] == "normal"]


@pytest.mark.parametrize("op,dtype,gate,B,T,H,K,V,h0,oft", PARAMS)
def test_matches_float64_reference(op, dtype, gate, B, T, H, K, V, h0, oft):
    spec, fn = OPS[op]
    x = make_inputs(spec, B, T, H, K, V, dtype, gate, h0)
    got = run(fn, x, oft)
    assert (got["ht"] is not None) == oft
    assert_matches_reference(spec, got, reference(spec, x, oft), dtype, rounded_once=True)


def test_simple_gla_without_gate_is_linear_attention():
    """g=None: forward and backward run, the gate's gradient is None, and every tensor equals
    fused_recurrent_linear_attn's (the same kernels without a gate) and the float64 reference."""
    x = make_inputs(SIMPLE_GLA, 1, CHUNK + 3, 2, 16, 24, torch.float32, h0=True, none=("g",))
    got = run(fused_recurrent_simple_gla, x, True)
    assert got["dg"] is None
    assert_matches_reference(SIMPLE_GLA, got, reference(SIMPLE_GLA, x, True), torch.float32)
    q, k, v, _ = x.args()
    o1, h1 = fused_recurrent_simple_gla(q, k, v, None, initial_state=x.initial_state(), output_final_state=True)
    o2, h2 = fused_recurrent_linear_attn(q, k, v, initial_state=x.initial_state(), output_final_state=True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)


@pytest.mark.parametrize("op,wanted,loss_on", [("gla", ("g", "h0"), "ht"), ("simple_gla", ("q", "v"), "o"),
                                                ("simple_gla", ("g",), "both"), ("linear_attn", ("k",), "both")])
def test_subsets_of_gradients_and_of_outputs_used(op, wanted, loss_on):
    """Only some inputs require grad and the loss uses only o or only ht: what is asked for stays right."""
    spec, fn = OPS[op]
    x = make_inputs(spec, 1, CHUNK + 5, 1, 16, 16, torch.float32, "strong", True, seed=2)
    kw = dict(grads=[n for n in wanted if n != "h0"], h0_grad="h0" in wanted, loss_on=loss_on)
    got = run(fn, x, True, **kw)
    ref = reference(spec, x, True, **kw)
    for n in [s.name for s in spec.inputs] + ["h0"]:
        key = "d" + n
        assert (got[key] is not None) == (n in wanted), f"{key}: returned {'no ' * (got[key] is None)}gradient"
        if n in wanted:
            assert_close(key, got[key], ref[key], REL_TOL[torch.float32])


@pytest.mark.parametrize("op", ["gla", "simple_gla"])
def test_segments_custom_scale_non_contiguous(op):
    """T split in two segments with the state carried equals one call; scale is passed through;
    non-contiguous inputs give the reference's numbers."""
    spec, fn = OPS[op]
    x = make_inputs(spec, 1, 30, 2, 16, 8, torch.float32, "normal", True, seed=3)
    strided = x.replace(**{n: t.transpose(1, 2).contiguous().transpose(1, 2) for n, t in x.tensors.items()})
    assert not strided.tensors["q"].is_contiguous()
    full = run(fn, strided, True, scale=0.3)
    assert_matches_reference(spec, full, reference(spec, x, True, scale=0.3), torch.float32)
    parts = run(segmented(fn, [17]), x, True, scale=0.3)
    for name, t in full.items():
        assert_close(f"{name} (segmented vs one call)", parts[name], t, 1e-5)


@pytest.mark.parametrize("op", list(OPS))
def test_inputs_unchanged_and_deterministic(op):
    spec, fn = OPS[op]
    x = make_inputs(spec, 1, 20, 1, 16, 16, torch.bfloat16, "strong", True, seed=4)
    before = x.snapshot()
    first = run(fn, x, True)
    second = run(fn, x, True)
    assert_unchanged(x, before)
    assert_identical(first, second)


@pytest.mark.parametrize("op,bad", [("gla", "v_time"), ("gla", "g_shape"), ("gla", "mixed_dtype"),
                                    ("simple_gla", "g_shape"), ("simple_gla", "state_shape"),
                                    ("linear_attn", "k_ndim"), ("linear_attn", "int_dtype")])
def test_rejects_bad_arguments(op, bad):
    spec, fn = OPS[op]
    args = make_inputs(spec, 1, 8, 2, 16, 8, torch.float32, h0=False).args()
    state = None
    if bad == "v_time":
        args[2] = args[2][:, :5]
    elif bad == "g_shape":
        args[3] = args[3][..., :1] if op == "gla" else args[3][..., None]
    elif bad == "mixed_dtype":
        args[1] = args[1].half()
    elif bad == "state_shape":
        state = torch.zeros(1, 2, 8, 16, device=DEVICE)
    elif bad == "k_ndim":
        args[1] = args[1][0]
    elif bad == "int_dtype":
        args[0] = args[0].long()
    with pytest.raises(ValueError, match=fn.__name__):
        fn(*args, initial_state=state)
