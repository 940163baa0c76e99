"""chunk_rwkv6 against the float64 recurrent reference: outputs, final state, every gradient.

Runs on CPU through the Triton interpreter (set by `import fla_kernels` when CUDA is absent), so
shapes stay small. Inputs, runner, reference and assertions come from tests/kernel_testing.py: inputs
generated in the kernel's dtype and upcast exactly to float64 for the reference, one shared random
upstream gradient for o and one for the final state, max|X - X64| <= REL_TOL[dtype] * max|X64|.
"""
from __future__ import annotations

import functools

import pytest
import torch

from fla_kernels.ops.rwkv6.chunk import chunk_rwkv6
from references.rwkv6 import rwkv6_chunked, rwkv6_recurrent
from tests.kernel_testing import (DEVICE, REL_TOL, RWKV6, assert_close, assert_identical,
                                  assert_matches_reference, assert_unchanged, make_inputs, reference,
                                  run)


def check_case(B, T, H, K, V, dtype, gate="normal", use_h0=True, output_final_state=True, seed=0):
    x = make_inputs(RWKV6, B, T, H, K, V, dtype, gate, use_h0, seed)
    got = run(chunk_rwkv6, x, output_final_state)
    assert (got["ht"] is not None) == output_final_state
    return assert_matches_reference(RWKV6, got, reference(RWKV6, x, output_final_state), dtype)


SHAPES = [  # B, T, H, K, V, initial state, output_final_state
    pytest.param(2, 1, 2, 16, 8, True, True, id="T1"),
    pytest.param(1, 63, 1, 8, 16, False, False, id="T63-K8"),
    pytest.param(1, 64, 2, 64, 16, True, False, id="T64-K64-V16"),
    pytest.param(1, 65, 1, 16, 32, False, True, id="T65"),
    pytest.param(2, 130, 1, 60, 20, True, True, id="T130-nonpow2"),
    pytest.param(1, 70, 1, 100, 72, True, True, id="T70-K100-V72-split"),
]


@pytest.mark.parametrize("B,T,H,K,V,use_h0,output_final_state", SHAPES)
def test_fp32_matches_float64_reference(B, T, H, K, V, use_h0, output_final_state):
    check_case(B, T, H, K, V, torch.float32, "normal", use_h0, output_final_state)


@pytest.mark.parametrize("gate", ["strong", "extreme"])
@pytest.mark.parametrize("B,T,H,K,V", [(1, 130, 1, 16, 16), (1, 100, 2, 32, 24)])
def test_fp32_strong_decay_is_finite_and_accurate(B, T, H, K, V, gate):
    check_case(B, T, H, K, V, torch.float32, gate, use_h0=True, output_final_state=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("gate", ["normal", "strong"])
@pytest.mark.parametrize("B,T,H,K,V,use_h0", [(1, 130, 1, 16, 16, False), (1, 65, 2, 32, 24, True)])
def test_half_precision_matches_float64_reference(B, T, H, K, V, use_h0, gate, dtype):
    check_case(B, T, H, K, V, dtype, gate, use_h0, output_final_state=True)


def test_gate_gradient_summed_over_tokens_is_as_accurate_as_the_baseline():
    """What a layer's decay bias sees: sum_t dw_t * w_t (w = -exp(bias + ...)). Elementwise dw can
    pass while its errors share a sign over a chunk; on the H100's bf16 tensor cores the q dq - k dk
    sums once left a residue 20 times the baseline's (T=65). Under the interpreter products are
    fp32 and this only checks the sums; on a GPU it is the regression test."""
    B, T, K = (2, 1000, 64) if DEVICE == "cuda" else (1, 130, 16)
    x = make_inputs(RWKV6, B, T, 1, K, K, torch.bfloat16, h0=False)
    w = x.args(torch.float64)[3]
    exact = reference(RWKV6, x, False)["dw"]
    baseline = functools.partial(rwkv6_chunked, chunk_size=64, operand_dtype=torch.bfloat16)

    def summed_error(fn):
        return ((run(fn, x, False)["dw"].double() - exact) * w).sum(dim=1).abs().max().item()

    assert summed_error(chunk_rwkv6) <= 2 * summed_error(baseline) + 1e-3


def test_gradient_from_final_state_alone():
    """o unused: the only upstream gradient is dht."""
    x = make_inputs(RWKV6, 1, 70, 1, 16, 16, torch.float32)
    got = run(chunk_rwkv6, x, True, loss_on="ht")
    assert got["dr"].abs().max() == 0, "dr must be zero when only the final state is used"
    assert_matches_reference(RWKV6, got, reference(RWKV6, x, True, loss_on="ht"), torch.float32)


def test_only_requested_gradients_are_returned():
    x = make_inputs(RWKV6, 1, 20, 1, 16, 16, torch.float32)
    got = run(chunk_rwkv6, x, False, grads=("v",), h0_grad=False)  # h0 given, without grad
    assert got["ht"] is None
    assert torch.isfinite(got["dv"]).all() and got["dv"].abs().max() > 0
    assert all(got[n] is None for n in ("dr", "dk", "dw", "du", "dh0"))
    ref = reference(RWKV6, x, False, grads=("v",), h0_grad=False)
    assert_close("dv", got["dv"], ref["dv"], REL_TOL[torch.float32])


def test_scale_is_passed_through():
    x = make_inputs(RWKV6, 1, 40, 1, 16, 16, torch.float32, h0=False)
    o, _ = chunk_rwkv6(*x.args(), scale=0.3)
    o_ref, _ = rwkv6_recurrent(*x.args(torch.float64), scale=0.3)
    assert_close("o", o, o_ref, REL_TOL[torch.float32])


def test_inputs_unchanged_and_results_deterministic():
    x = make_inputs(RWKV6, 1, 70, 2, 16, 24, torch.float32, gate="strong")
    before = x.snapshot()
    first = run(chunk_rwkv6, x, True)
    assert_unchanged(x, before)
    second = run(chunk_rwkv6, x, True)
    assert_identical(first, second)


@pytest.mark.parametrize("bad", ["k_shape", "v_batch", "w_time", "u_shape", "h0_shape", "mixed_dtype",
                                 "r_3d", "empty"])
def test_bad_arguments_raise_value_error(bad):
    x = make_inputs(RWKV6, 1, 8, 2, 16, 8, torch.float32)
    (r, k, v, w, u), h0 = x.args(), x.initial_state()
    if bad == "k_shape":
        k = k[..., :8]
    elif bad == "v_batch":
        v = torch.cat([v, v])
    elif bad == "w_time":
        w = w[:, :5]
    elif bad == "u_shape":
        u = u[:1]
    elif bad == "h0_shape":
        h0 = h0.transpose(-1, -2)
    elif bad == "mixed_dtype":
        v = v.to(torch.float16)
    elif bad == "r_3d":
        r = r[0]
    elif bad == "empty":
        r, k, v, w = r[:, :0], k[:, :0], v[:, :0], w[:, :0]
    with pytest.raises(ValueError) as info:
        chunk_rwkv6(r, k, v, w, u, initial_state=h0, output_final_state=True)
    message = str(info.value)
    assert message.startswith("chunk_rwkv6") and "\n" not in message


def test_backward_with_the_forward_scores_equals_recomputing_them():
    """The backward takes the intra-chunk scores A from the forward; recomputed, they give the
    same gradients bit for bit (the wrappers pass A along; this pins that it is the same A)."""
    from fla_kernels.ops.common.chunk_gated import chunk_gated_bwd, chunk_gated_fwd
    x = make_inputs(RWKV6, 1, 70, 2, 16, 24, torch.float32, gate="strong")
    r, k, v, w, u = x.args()
    h0 = x.initial_state()
    _, _, A = chunk_gated_fwd(r, k, v, w, u, 0.3, h0, reads_previous=True)
    common = (r, k, v, w, u, 0.3, h0, x.do, x.dht[0])
    kept = chunk_gated_bwd(*common, reads_previous=True, A=A)
    again = chunk_gated_bwd(*common, reads_previous=True)
    for name, a, b in zip(["dr", "dk", "dv", "dw", "du", "dh0"], kept, again):
        assert torch.equal(a, b), name
