"""chunk_simple_gla against the float64 recurrent reference: outputs, final state, every gradient.

CPU: Triton interpreter. Inputs, runner, reference and assertions come from tests/kernel_testing.py:
inputs generated in the kernel's dtype and upcast exactly to float64 for the reference, one shared
upstream gradient for o and one for the final state, max|X - X64| <= REL_TOL[dtype] * max|X64|
(dg included: the kernel leaves the gate-free terms out of its dg sums).
"""
import pytest
import torch

from fla_kernels.ops.linear_attn.chunk import chunk_linear_attn
from fla_kernels.ops.simple_gla.chunk import BT, chunk_simple_gla
from fla_kernels.ops.simple_gla.fused_recurrent import fused_recurrent_simple_gla
from harness.registry import get_op
from tests.kernel_testing import (DEVICE, REL_TOL, assert_close, assert_identical,
                                  assert_matches_reference, assert_unchanged, make_inputs, reference, run,
                                  segmented)

SIMPLE_GLA = get_op("simple_gla")


def check_case(B, T, H, K, V, dtype, gate="normal", use_h0=True, oft=True, seed=0, none=()):
    x = make_inputs(SIMPLE_GLA, B, T, H, K, V, dtype, gate, use_h0, seed, none=none)
    got = run(chunk_simple_gla, x, oft)
    assert (got["ht"] is not None) == oft
    return assert_matches_reference(SIMPLE_GLA, got, reference(SIMPLE_GLA, x, oft), dtype)


SHAPES = [  # B, T, H, K, V, initial state, output_final_state
    pytest.param(2, 1, 2, 16, 8, True, True, id="T1"),
    pytest.param(1, BT - 1, 1, 8, 16, False, False, id="T63-K8"),
    pytest.param(1, BT, 2, 64, 16, True, False, id="T64-K64-V16"),
    pytest.param(1, BT + 1, 1, 16, 32, False, True, id="T65"),
    pytest.param(2, 2 * BT + 2, 1, 60, 20, True, True, id="T130-nonpow2"),
    pytest.param(1, 70, 1, 100, 72, True, True, id="T70-K100-V72-split"),
]


@pytest.mark.parametrize("B,T,H,K,V,use_h0,oft", SHAPES)
def test_fp32_matches_float64_reference(B, T, H, K, V, use_h0, oft):
    check_case(B, T, H, K, V, torch.float32, "normal", use_h0, oft)


@pytest.mark.parametrize("gate", ["strong", "extreme"])
@pytest.mark.parametrize("B,T,H,K,V", [(1, 2 * BT + 2, 1, 16, 16), (1, 100, 2, 32, 24), (2, 1, 1, 8, 8)])
def test_fp32_strong_decay_is_finite_and_accurate(B, T, H, K, V, gate):
    check_case(B, T, H, K, V, torch.float32, gate, use_h0=True)


@pytest.mark.parametrize("dtype,gate,B,T,H,K,V,use_h0", [
    pytest.param(torch.bfloat16, "normal", 1, 2 * BT + 2, 1, 16, 16, False, id="bf16-normal-T130"),
    pytest.param(torch.bfloat16, "strong", 1, 2 * BT + 2, 1, 16, 16, False, id="bf16-strong-T130"),
    pytest.param(torch.bfloat16, "strong", 1, BT + 1, 2, 32, 24, True, id="bf16-strong-T65"),
    pytest.param(torch.bfloat16, "extreme", 1, BT + 1, 1, 32, 24, True, id="bf16-extreme-T65"),
    pytest.param(torch.float16, "normal", 1, BT + 1, 2, 32, 24, True, id="fp16-normal-T65"),
    pytest.param(torch.float16, "strong", 1, 2 * BT + 2, 1, 16, 16, False, id="fp16-strong-T130"),
])
def test_half_precision_matches_float64_reference(B, T, H, K, V, use_h0, gate, dtype):
    check_case(B, T, H, K, V, dtype, gate, use_h0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_without_gate_is_linear_attention(dtype):
    """g=None: backward runs and returns None in the gate's place (the gradient tuple keeps its
    length); every tensor matches the reference and equals chunk_linear_attn's bit for bit."""
    x = make_inputs(SIMPLE_GLA, 1, BT + 3, 2, 16, 24, dtype, h0=True, none=("g",))
    got = run(chunk_simple_gla, x, True)
    assert got["dg"] is None
    assert_matches_reference(SIMPLE_GLA, got, reference(SIMPLE_GLA, x, True), dtype)
    q, k, v, g = x.args()
    assert g is None
    o1, h1 = chunk_simple_gla(q, k, v, None, initial_state=x.initial_state(), output_final_state=True)
    o2, h2 = chunk_linear_attn(q, k, v, initial_state=x.initial_state(), output_final_state=True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)


def test_chunk_agrees_with_fused_recurrent():
    """Same inputs, same scale: the chunked and token-by-token kernels agree to fp32 precision."""
    x = make_inputs(SIMPLE_GLA, 1, BT + 7, 1, 16, 16, torch.float32, "normal", True, seed=5)
    a = run(chunk_simple_gla, x, True, scale=0.4)
    b = run(fused_recurrent_simple_gla, x, True, scale=0.4)
    for name in a:
        assert_close(f"{name} (chunk vs fused_recurrent)", a[name], b[name], 1e-5)


def test_gradient_from_final_state_alone_and_subsets():
    """o unused (dq must be zero), and only some gradients requested: those stay right."""
    x = make_inputs(SIMPLE_GLA, 1, 70, 1, 16, 16, torch.float32, "strong")
    got = run(chunk_simple_gla, x, True, loss_on="ht")
    assert got["dq"].abs().max() == 0, "dq must be zero when only the final state is used"
    assert_matches_reference(SIMPLE_GLA, got, reference(SIMPLE_GLA, x, True, loss_on="ht"), torch.float32)
    got = run(chunk_simple_gla, x, False, grads=("g",), h0_grad=False)
    assert all(got[n] is None for n in ("ht", "dq", "dk", "dv", "dh0"))
    ref = reference(SIMPLE_GLA, x, False, grads=("g",), h0_grad=False)
    assert_close("dg", got["dg"], ref["dg"], REL_TOL[torch.float32])


def test_segments_custom_scale_non_contiguous():
    x = make_inputs(SIMPLE_GLA, 1, 90, 2, 16, 8, torch.float32, "normal", True, seed=3)
    strided = x.replace(**{n: t.transpose(1, 2).contiguous().transpose(1, 2) for n, t in x.tensors.items()})
    assert not strided.tensors["q"].is_contiguous()
    full = run(chunk_simple_gla, strided, True, scale=0.3)
    assert_matches_reference(SIMPLE_GLA, full, reference(SIMPLE_GLA, x, True, scale=0.3), torch.float32)
    parts = run(segmented(chunk_simple_gla, [37]), x, True, scale=0.3)
    for name, t in full.items():
        assert_close(f"{name} (segmented vs one call)", parts[name], t, 1e-5)


def test_inputs_unchanged_and_deterministic():
    x = make_inputs(SIMPLE_GLA, 1, 70, 2, 16, 24, torch.bfloat16, "strong", True, seed=4)
    before = x.snapshot()
    first = run(chunk_simple_gla, x, True)
    second = run(chunk_simple_gla, x, True)
    assert_unchanged(x, before)
    assert_identical(first, second)


@pytest.mark.parametrize("bad", ["v_time", "g_per_channel", "mixed_dtype", "state_shape", "q_ndim", "empty"])
def test_rejects_bad_arguments(bad):
    q, k, v, g = make_inputs(SIMPLE_GLA, 1, 8, 2, 16, 8, torch.float32, h0=False).args()
    state = None
    if bad == "v_time":
        v = v[:, :5]
    elif bad == "g_per_channel":
        g = g[..., None].expand(1, 8, 2, 16)
    elif bad == "mixed_dtype":
        g = g.half()
    elif bad == "state_shape":
        state = torch.zeros(1, 2, 8, 16, device=DEVICE)
    elif bad == "q_ndim":
        q = q[0]
    elif bad == "empty":
        q, k, v, g = q[:, :0], k[:, :0], v[:, :0], g[:, :0]
    with pytest.raises(ValueError, match="chunk_simple_gla"):
        chunk_simple_gla(q, k, v, g, initial_state=state)
