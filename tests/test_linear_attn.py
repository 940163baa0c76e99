"""chunk_linear_attn and fused_chunk_linear_attn against the float64 recurrent reference
(fused_recurrent_linear_attn is covered with its family in test_fused_recurrent_family.py).

CPU: Triton interpreter. Inputs, runner, reference and assertions come from tests/kernel_testing.py:
max|X - X64| <= REL_TOL[dtype] * max|X64| for o, the final state and every gradient.
"""
import pytest
import torch

from fla_kernels.ops.linear_attn.chunk import chunk_linear_attn
from fla_kernels.ops.linear_attn.fused_chunk import BT, fused_chunk_linear_attn
from fla_kernels.ops.linear_attn.fused_recurrent import fused_recurrent_linear_attn
from harness.registry import get_op
from tests.kernel_testing import (DEVICE, assert_close, assert_identical, assert_matches_reference,
                                  assert_unchanged, make_inputs, reference, run, segmented)

LINEAR_ATTN = get_op("linear_attn")
FNS = {"chunk": chunk_linear_attn, "fused_chunk": fused_chunk_linear_attn}

SHAPES = [  # dtype, B, T, H, K, V, initial state, output_final_state
    pytest.param(torch.float32, 2, 1, 2, 16, 8, True, True, id="fp32-T1"),
    pytest.param(torch.float32, 1, BT - 1, 1, 8, 16, False, False, id="fp32-T63-K8"),
    pytest.param(torch.float32, 1, BT, 2, 64, 16, True, False, id="fp32-T64-K64-V16"),
    pytest.param(torch.float32, 1, BT + 1, 1, 16, 32, False, True, id="fp32-T65"),
    pytest.param(torch.float32, 2, 2 * BT + 2, 1, 60, 20, True, True, id="fp32-T130-nonpow2"),
    pytest.param(torch.float32, 1, 70, 1, 100, 72, True, True, id="fp32-T70-K100-V72-split"),
    pytest.param(torch.bfloat16, 1, 2 * BT + 2, 1, 16, 16, False, True, id="bf16-T130"),
    pytest.param(torch.bfloat16, 1, BT + 1, 2, 32, 24, True, True, id="bf16-T65"),
    pytest.param(torch.float16, 1, BT + 1, 2, 32, 24, True, True, id="fp16-T65"),
]


@pytest.mark.parametrize("variant", list(FNS))
@pytest.mark.parametrize("dtype,B,T,H,K,V,use_h0,oft", SHAPES)
def test_matches_float64_reference(variant, dtype, B, T, H, K, V, use_h0, oft):
    x = make_inputs(LINEAR_ATTN, B, T, H, K, V, dtype, h0=use_h0)
    got = run(FNS[variant], x, oft)
    assert (got["ht"] is not None) == oft
    assert_matches_reference(LINEAR_ATTN, got, reference(LINEAR_ATTN, x, oft), dtype)


def test_variants_agree():
    """chunk, fused_chunk and fused_recurrent on the same inputs with the same scale agree to fp32 precision."""
    x = make_inputs(LINEAR_ATTN, 1, BT + 7, 1, 16, 16, torch.float32, seed=5)
    results = {name: run(fn, x, True, scale=0.4) for name, fn in
               (("chunk", chunk_linear_attn), ("fused_chunk", fused_chunk_linear_attn),
                ("fused_recurrent", fused_recurrent_linear_attn))}
    for name in ("fused_chunk", "fused_recurrent"):
        for key, t in results["chunk"].items():
            assert_close(f"{key} ({name} vs chunk)", results[name][key], t, 1e-5)


@pytest.mark.parametrize("variant", list(FNS))
def test_loss_on_final_state_only_and_subsets(variant):
    fn = FNS[variant]
    x = make_inputs(LINEAR_ATTN, 1, 70, 1, 16, 16, torch.float32)
    got = run(fn, x, True, loss_on="ht")
    assert got["dq"].abs().max() == 0, "dq must be zero when only the final state is used"
    assert_matches_reference(LINEAR_ATTN, got, reference(LINEAR_ATTN, x, True, loss_on="ht"), torch.float32)
    got = run(fn, x, False, grads=("v",), h0_grad=False)
    assert all(got[n] is None for n in ("ht", "dq", "dk", "dh0"))
    assert_close("dv", got["dv"], reference(LINEAR_ATTN, x, False, grads=("v",), h0_grad=False)["dv"], 1e-5)


@pytest.mark.parametrize("variant", list(FNS))
def test_segments_custom_scale_non_contiguous(variant):
    fn = FNS[variant]
    x = make_inputs(LINEAR_ATTN, 1, 90, 2, 16, 8, torch.float32, seed=3)
    strided = x.replace(**{n: t.transpose(1, 2).contiguous().transpose(1, 2) for n, t in x.tensors.items()})
    assert not strided.tensors["q"].is_contiguous()
    full = run(fn, strided, True, scale=0.3)
    assert_matches_reference(LINEAR_ATTN, full, reference(LINEAR_ATTN, x, True, scale=0.3), torch.float32)
    parts = run(segmented(fn, [37]), x, True, scale=0.3)
    for name, t in full.items():
        assert_close(f"{name} (segmented vs one call)", parts[name], t, 1e-5)


@pytest.mark.parametrize("variant", list(FNS))
def test_inputs_unchanged_and_deterministic(variant):
    x = make_inputs(LINEAR_ATTN, 1, 70, 2, 16, 24, torch.bfloat16, seed=4)
    before = x.snapshot()
    first = run(FNS[variant], x, True)
    second = run(FNS[variant], x, True)
    assert_unchanged(x, before)
    assert_identical(first, second)


@pytest.mark.parametrize("variant", list(FNS))
@pytest.mark.parametrize("bad", ["v_time", "mixed_dtype", "state_shape", "q_ndim", "empty", "state_not_tensor"])
def test_rejects_bad_arguments(variant, bad):
    fn = FNS[variant]
    q, k, v = make_inputs(LINEAR_ATTN, 1, 8, 2, 16, 8, torch.float32, h0=False).args()
    state = None
    if bad == "v_time":
        v = v[:, :5]
    elif bad == "mixed_dtype":
        v = v.half()
    elif bad == "state_shape":
        state = torch.zeros(1, 2, 8, 16, device=DEVICE)
    elif bad == "q_ndim":
        q = q[0]
    elif bad == "empty":
        q, k, v = q[:, :0], k[:, :0], v[:, :0]
    elif bad == "state_not_tensor":
        state = [[0.0]]
    with pytest.raises(ValueError, match=fn.__name__):
        fn(q, k, v, initial_state=state)
