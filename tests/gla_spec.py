"""The checks every GLA kernel test file runs.

Shared by tests/test_gla_chunk.py and tests/test_gla_fused_chunk.py (each passes its public function);
kept out of kernel_testing.py, which belongs to the shared oracle.
"""
from __future__ import annotations

import pytest
import torch

from harness.registry import get_op
from references.gla import gla_recurrent
from tests.kernel_testing import (REL_TOL, assert_close, assert_identical,
                                  assert_matches_reference, assert_unchanged, make_inputs, reference, run)

GLA = get_op("gla")

SHAPES = [  # B, T, H, K, V, initial state, output_final_state
    pytest.param(2, 1, 2, 16, 8, True, True, id="T1"),
    pytest.param(1, 63, 1, 8, 16, False, False, id="T63-K8"),
    pytest.param(1, 64, 2, 64, 16, True, False, id="T64-K64-V16"),
    pytest.param(1, 65, 1, 16, 32, False, True, id="T65"),
    pytest.param(1, 130, 1, 60, 20, True, True, id="T130-nonpow2"),
    pytest.param(1, 70, 1, 100, 72, True, True, id="T70-K100-V72-split"),
]
STRONG_SHAPES = [(1, 130, 1, 16, 16), (1, 100, 2, 32, 8)]
HALF_SHAPES = [(1, 130, 1, 16, 16, False), (1, 65, 2, 16, 24, True)]
BAD_ARGUMENTS = ["k_shape", "v_batch", "g_time", "h0_shape", "mixed_dtype", "q_3d", "empty", "int_dtype"]


def check_case(fn, B, T, H, K, V, dtype, gate="normal", use_h0=True, output_final_state=True, seed=0):
    """fn against the float64 loop on one case: every tensor within REL_TOL[dtype]; relative errors."""
    x = make_inputs(GLA, B, T, H, K, V, dtype, gate, use_h0, seed)
    got = run(fn, x, output_final_state)
    assert (got["ht"] is not None) == output_final_state
    return assert_matches_reference(GLA, got, reference(GLA, x, output_final_state), dtype)


def check_gradient_from_final_state_alone(fn):
    """o unused: the only upstream gradient is dht; dq must be exactly zero."""
    x = make_inputs(GLA, 1, 70, 1, 16, 16, torch.float32)
    got = run(fn, x, True, loss_on="ht")
    assert got["dq"].abs().max() == 0, "dq must be zero when only the final state is used"
    assert_matches_reference(GLA, got, reference(GLA, x, True, loss_on="ht"), torch.float32)


def check_only_requested_gradients(fn):
    x = make_inputs(GLA, 1, 20, 1, 16, 16, torch.float32)
    got = run(fn, x, False, grads=("v",), h0_grad=False)  # h0 given, without grad
    assert got["ht"] is None
    assert torch.isfinite(got["dv"]).all() and got["dv"].abs().max() > 0
    assert all(got[n] is None for n in ("dq", "dk", "dg", "dh0"))
    ref = reference(GLA, x, False, grads=("v",), h0_grad=False)
    assert_close("dv", got["dv"], ref["dv"], REL_TOL[torch.float32])


def check_scale(fn):
    x = make_inputs(GLA, 1, 40, 1, 16, 16, torch.float32, h0=False)
    o, _ = fn(*x.args(), scale=0.3)
    o_ref, _ = gla_recurrent(*x.args(torch.float64), scale=0.3)
    assert_close("o", o, o_ref, REL_TOL[torch.float32])


def check_unchanged_and_deterministic(fn):
    x = make_inputs(GLA, 1, 70, 1, 16, 24, torch.float32, gate="strong")
    before = x.snapshot()
    first = run(fn, x, True)
    assert_unchanged(x, before)
    second = run(fn, x, True)
    assert_identical(first, second)


def check_non_contiguous(fn):
    """Inputs that are strided views give the same numbers as contiguous copies."""
    x = make_inputs(GLA, 1, 20, 2, 16, 8, torch.float32)
    views = {n: t.transpose(1, 2).contiguous().transpose(1, 2) for n, t in x.tensors.items()}
    assert not views["q"].is_contiguous()
    got = run(fn, x.replace(**views), True)
    assert_identical(got, run(fn, x, True))


def check_bad_argument(fn, name, bad):
    x = make_inputs(GLA, 1, 8, 2, 16, 8, torch.float32)
    (q, k, v, g), h0 = x.args(), x.initial_state()
    if bad == "k_shape":
        k = k[..., :8]
    elif bad == "v_batch":
        v = torch.cat([v, v])
    elif bad == "g_time":
        g = g[:, :5]
    elif bad == "h0_shape":
        h0 = h0.transpose(-1, -2)
    elif bad == "mixed_dtype":
        v = v.to(torch.float16)
    elif bad == "q_3d":
        q = q[0]
    elif bad == "empty":
        q, k, v, g = q[:, :0], k[:, :0], v[:, :0], g[:, :0]
    elif bad == "int_dtype":
        q, k, v, g = (t.to(torch.int32) for t in (q, k, v, g))
    with pytest.raises(ValueError) as info:
        fn(q, k, v, g, initial_state=h0, output_final_state=True)
    message = str(info.value)
    assert message.startswith(name) and "\n" not in message


def check_compiles_for_sm90(fn):
    """Every kernel specialisation fn launches (bf16 / fp32, K != V, non-power-of-two, with and
    without an initial state, forward and backward) compiles for Hopper; see tests/gpu_compile.py."""
    from tests.gpu_compile import compile_records, distinct, recording_launches
    with recording_launches() as records:
        for dtype in (torch.bfloat16, torch.float32):
            for K, V in ((64, 16), (60, 60)):
                for with_h0 in (False, True):
                    B, T, H = 1, 70, 2
                    q, k, g = (torch.randn(B, T, H, K, dtype=dtype, requires_grad=True) for _ in range(3))
                    v = torch.randn(B, T, H, V, dtype=dtype, requires_grad=True)
                    h0 = torch.randn(B, H, K, V, requires_grad=True) if with_h0 else None
                    o, ht = fn(q, k, v, g, initial_state=h0, output_final_state=True)
                    torch.autograd.backward([o, ht], [torch.randn_like(o), torch.randn_like(ht)])
    records = distinct(records)
    assert len({r["name"] for r in records}) >= 3, "no kernel launch was recorded"
    failures = [r for r in compile_records(records) if not r["ok"]]
    assert not failures, "\n\n".join(f"{f['name']} {f['constexprs']}:\n{f['error']}" for f in failures)
