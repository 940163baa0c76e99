"""fused_recurrent_gsa and chunk_gsa against the float64 recurrent reference (CPU: Triton interpreter).

Inputs, runner, reference and assertions come from tests/kernel_testing.py, with the GSA declaration, whose
state is the pair (hk [B, H, K, M], hv [B, H, M, V]). Bounds: max|X - X64| <= REL_TOL[dtype] * max|X64|
for every tensor (dg included: the kernels leave the gate-free terms out of their dg sums, so fp32 dg
keeps 1e-5 under strong decay, and is exactly 0 at T = 1 with no initial state); the token-by-token
kernel's fp16 / bf16 results, computed in fp32 and rounded once, within half an ulp of float64.
"""
import pytest
import torch

from fla_kernels.ops.gsa import chunk_gsa, fused_recurrent_gsa
from harness.registry import get_op
from references.gsa import gsa_recurrent
from tests.kernel_testing import (DEVICE, REL_TOL, assert_close, assert_identical,
                                  assert_matches_reference, assert_unchanged, make_inputs, reference, run,
                                  segmented)

GSA = get_op("gsa")
IMPLS = [fused_recurrent_gsa, chunk_gsa]
name_of = {fused_recurrent_gsa: "fused_recurrent", chunk_gsa: "chunk"}

CASES = [
    # dtype, gate, B, T, H, K, V, M, initial state, output_final_state
    (torch.float32, "normal", 1, 1, 1, 16, 16, 16, False, False),
    (torch.float32, "strong", 2, 1, 1, 16, 8, 16, False, True),        # dg exactly 0: gate-free terms
    (torch.float32, "normal", 1, 63, 1, 32, 16, 16, True, True),
    (torch.float32, "strong", 1, 64, 1, 16, 32, 32, True, True),
    (torch.float32, "strong", 2, 65, 1, 20, 12, 24, False, True),      # non-powers of two, M = 24
    (torch.float32, "normal", 1, 130, 1, 16, 8, 16, True, True),       # three chunks
    (torch.float32, "strong", 1, 5, 1, 128, 40, 64, True, True),       # K = 128, M = 64
    (torch.bfloat16, "strong", 1, 65, 1, 32, 16, 32, True, True),
    (torch.bfloat16, "normal", 1, 63, 1, 16, 24, 16, False, False),
    (torch.float16, "normal", 1, 64, 1, 16, 16, 64, True, True),
]


def _ids(p):
    return name_of.get(p, str(p).replace("torch.", ""))


@pytest.mark.parametrize("fn", IMPLS, ids=_ids)
@pytest.mark.parametrize("dtype,gate,B,T,H,K,V,M,h0,oft", CASES, ids=_ids)
def test_matches_float64_reference(fn, dtype, gate, B, T, H, K, V, M, h0, oft):
    x = make_inputs(GSA, B, T, H, K, V, dtype, gate, h0, M=M)
    got = run(fn, x, oft)
    assert (got["hkt"] is not None) == oft and (got["hvt"] is not None) == oft
    assert_matches_reference(GSA, got, reference(GSA, x, oft), dtype,
                             rounded_once=fn is fused_recurrent_gsa)


@pytest.mark.parametrize("fn", IMPLS, ids=_ids)
def test_custom_scale_and_non_contiguous_inputs(fn):
    x = make_inputs(GSA, 1, 20, 2, 16, 8, torch.float32, "normal", True, seed=1, M=16)
    strided = x.replace(**{n: t.transpose(1, 2).contiguous().transpose(1, 2) for n, t in x.tensors.items()})
    assert not strided.tensors["q"].is_contiguous()
    got = run(fn, strided, True, scale=0.3)
    assert_matches_reference(GSA, got, reference(GSA, x, True, scale=0.3), torch.float32)


@pytest.mark.parametrize("fn", IMPLS, ids=_ids)
@pytest.mark.parametrize("wanted,loss_on", [(("g", "h0"), "ht"), (("q", "v", "s"), "o"), (("k", "s"), "both")])
def test_subsets_of_gradients_and_of_outputs_used(fn, wanted, loss_on):
    """Only some inputs require grad and the loss uses only o or only the final states.

    (Normal gates: under strong decay dh0 after 24 steps is ~1e-230, below float32's range.)"""
    x = make_inputs(GSA, 1, 24, 1, 16, 8, torch.float32, "normal", True, seed=2, M=16)
    kw = dict(grads=[n for n in wanted if n != "h0"], h0_grad="h0" in wanted, loss_on=loss_on)
    got = run(fn, x, True, **kw)
    ref = reference(GSA, x, True, **kw)
    for key in ["d" + s.name for s in GSA.inputs] + ["dhk0", "dhv0"]:
        asked = key[1:] in wanted or (key in ("dhk0", "dhv0") and "h0" in wanted)
        assert (got[key] is not None) == asked, f"{key}: returned {'no ' * (got[key] is None)}gradient"
        if asked:
            assert_close(key, got[key], ref[key], REL_TOL[torch.float32])


@pytest.mark.parametrize("fn", IMPLS, ids=_ids)
def test_gradient_from_one_final_state_only(fn):
    """The loss uses o and hv but not hk: autograd hands the backward no gradient for hk."""
    x = make_inputs(GSA, 1, 20, 1, 16, 8, torch.float32, "normal", True, seed=5, M=16)
    outs = []
    for f in (fn, gsa_recurrent):
        dt = torch.float64 if f is gsa_recurrent else torch.float32
        leaves = [t.detach().to(dt).requires_grad_() for t in x.args()]
        h0 = tuple(t.detach().to(dt).requires_grad_() for t in x.h0)
        o, (hk, hv) = f(*leaves, initial_state=h0, output_final_state=True)
        torch.autograd.backward([o, hv], [x.do.to(dt), x.dht[1].to(dt)])
        outs.append([t.grad for t in leaves + list(h0)])
    for name, got, ref in zip(["dq", "dk", "dv", "ds", "dg", "dhk0", "dhv0"], *outs):
        assert_close(name, got, ref, REL_TOL[torch.float32])


@pytest.mark.parametrize("fn", IMPLS, ids=_ids)
def test_segments_with_carried_state_equal_one_call(fn):
    """T split in two segments, the final states of the first fed to the second: same o and grads."""
    x = make_inputs(GSA, 1, 36, 1, 16, 8, torch.float32, "normal", True, seed=3, M=16)
    full = run(fn, x, True)
    parts = run(segmented(fn, [17]), x, True)
    for name, t in full.items():
        assert_close(f"{name} (segmented vs one call)", parts[name], t, 1e-5)


def test_chunk_and_recurrent_agree():
    x = make_inputs(GSA, 1, 40, 1, 16, 16, torch.float32, "normal", True, seed=6, M=32)
    a, b = run(fused_recurrent_gsa, x, True), run(chunk_gsa, x, True)
    for name, t in a.items():
        assert_close(f"{name} (chunk vs fused_recurrent)", b[name], t, 1e-5)


@pytest.mark.parametrize("fn", IMPLS, ids=_ids)
def test_inputs_unchanged_and_deterministic(fn):
    x = make_inputs(GSA, 1, 40, 1, 16, 16, torch.bfloat16, "strong", True, seed=4, M=16)
    before = x.snapshot()
    first = run(fn, x, True)
    second = run(fn, x, True)
    assert_unchanged(x, before)
    assert_identical(first, second)


@pytest.mark.parametrize("T", [37, 65])
def test_chunk_reads_no_scratch_it_did_not_write(monkeypatch, T):
    """Every buffer chunk_gsa's launchers take from torch.empty / empty_like starts as NaN (the
    weights C, whose columns after a row's sub-chunk are never written, the scores, the paths into
    the leaving state, ...): o, the final states and every gradient stay the same to the bit."""
    x = make_inputs(GSA, 1, T, 2, 16, 8, torch.float32, "normal", True, seed=7, M=16)
    clean = run(chunk_gsa, x, True)
    empty, empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    monkeypatch.setattr(torch, "empty_like",
                        lambda *a, **kw: empty_like(*a, **kw).fill_(float("nan")))
    poisoned = run(chunk_gsa, x, True)
    for name, t in clean.items():
        assert torch.equal(poisoned[name], t), f"{name} changed when the scratch started as NaN"


@pytest.mark.parametrize("fn", IMPLS, ids=_ids)
@pytest.mark.parametrize("bad", ["v_time", "s_slots", "g_slots", "mixed_dtype", "hk_shape", "hv_shape",
                                 "state_not_pair", "q_ndim", "empty"])
def test_rejects_bad_arguments(fn, bad):
    q, k, v, s, g = make_inputs(GSA, 1, 8, 2, 16, 8, torch.float32, h0=False, M=16).args()
    state = None
    hk0, hv0 = torch.zeros(1, 2, 16, 16, device=DEVICE), torch.zeros(1, 2, 16, 8, device=DEVICE)
    if bad == "v_time":
        v = v[:, :5]
    elif bad == "s_slots":
        s = s[..., :8]
    elif bad == "g_slots":
        g = g[..., :8]
    elif bad == "mixed_dtype":
        k = k.half()
    elif bad == "hk_shape":
        state = (hk0[..., :8], hv0)
    elif bad == "hv_shape":
        state = (hk0, hv0.transpose(-1, -2))
    elif bad == "state_not_pair":
        state = hk0
    elif bad == "q_ndim":
        q = q[0]
    elif bad == "empty":
        q, k, v, s, g = (x[:, :0] for x in (q, k, v, s, g))
    with pytest.raises(ValueError, match=fn.__name__):
        fn(q, k, v, s, g, initial_state=state)
