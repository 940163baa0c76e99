"""Goldens on a sample of rows at one head, for cases too large for a whole float64 golden
(harness/sampling.py; here forced with a tiny GOLDEN_LIMIT): a correct implementation passes on
the sample, one wrong only at the last row and head (where offsets wrap) fails there, a parameter
shared by every row gets a SKIP row, and packed cases sample whole sequences."""
from dataclasses import replace

import pytest
import torch

from harness import sampling
from harness.inputs import make_inputs
from harness.registry import get_op
from harness.runner import case_context, run_case
from tests.kernel_testing import DEVICE
from tests.planted import CPU, SPEC, case, impl

PLAIN = replace(case(T=40), B=5)
PACKED = replace(PLAIN, varlen="packed")


@pytest.fixture(autouse=True)
def tiny_limit(monkeypatch):
    monkeypatch.setattr(sampling, "GOLDEN_LIMIT", 100)


def test_a_case_whose_reference_states_are_too_large_is_sampled(monkeypatch):
    monkeypatch.setattr(sampling, "GOLDEN_LIMIT", 10 ** 9)
    full = make_inputs(SPEC, PLAIN, CPU)
    assert sampling.reference_states(SPEC, full) == 5 * 2 * 8 * 6 * 40   # B H K V, a state per step
    assert sampling.choose_sample(SPEC, PLAIN, full) is None
    monkeypatch.setattr(sampling, "STATE_LIMIT", 1000)
    assert sampling.choose_sample(SPEC, PLAIN, full) is not None


def test_the_sample_holds_the_first_and_last_rows_at_the_last_head():
    sample = sampling.choose_sample(SPEC, PLAIN, make_inputs(SPEC, PLAIN, CPU))
    assert sample.rows[0] == 0 and sample.rows[-1] == 4 and sample.head == 1 and len(sample.rows) <= 3
    x = torch.arange(5 * 40 * 2 * 6.0).reshape(5, 40, 2, 6)
    assert torch.equal(sample.take(("B", "T", "H", "V"), x), x[list(sample.rows)][:, :, 1:2])
    assert sample.take(("H", "K"), x) is None


def test_a_sampled_golden_is_the_restriction_of_the_whole_one(monkeypatch):
    sampled = case_context(SPEC, PLAIN, CPU)
    monkeypatch.setattr(sampling, "GOLDEN_LIMIT", 10 ** 9)
    whole = case_context(SPEC, PLAIN, CPU)
    assert whole.sample is None and sampled.unsampled == ["du"]
    for name in sampled.names:
        torch.testing.assert_close(sampled.golden[name], sampled.take(name, whole.golden), rtol=1e-12, atol=1e-12)


def test_a_correct_implementation_passes_on_the_sample_and_a_shared_parameter_is_a_skip_row():
    rows = [r for r in run_case(SPEC, PLAIN, [impl("baseline_like")], CPU, checks=()) if r["check"] == "golden"]
    assert {r["tensor"]: r["verdict"] for r in rows} == {
        "o": "PASS", "ht": "PASS", "dr": "PASS", "dk": "PASS", "dv": "PASS", "dw": "PASS", "dh0": "PASS",
        "du": "SKIP"}
    assert "no golden on a sample" in next(r for r in rows if r["tensor"] == "du")["message"]


@pytest.mark.parametrize("c", [PLAIN, PACKED], ids=["plain", "packed"])
def test_a_wrong_last_row_at_the_last_head_fails_on_the_sample(c):
    rows = run_case(SPEC, c, [impl("last_row_last_head_zeroed")], CPU, checks=())
    o = next(r for r in rows if r["check"] == "golden" and r["tensor"] == "o")
    assert o["verdict"] == "FAIL" and "(golden on a sample: " in o["message"], o["message"]


def test_packed_cases_sample_whole_sequences():
    full = make_inputs(SPEC, PACKED, CPU)
    sample = sampling.choose_sample(SPEC, PACKED, full)
    sub = sample.inputs(SPEC, full)
    assert sub.bounds[-1] == len(sample.tokens) == sum(sample.lengths)
    assert sub.initial_states[0].shape == (len(sample.rows), 1, 8, 6)
    rows = run_case(SPEC, PACKED, [impl("packed_like")], CPU, checks=("packing",))
    assert {r["verdict"] for r in rows} == {"PASS", "SKIP"}


def test_a_sampled_case_runs_every_check_on_the_sample():
    gsa = get_op("gsa")
    c = replace(PLAIN, op="gsa", M=4, K=8, V=8, T=20)
    impls = [replace(impl("baseline_like"), fn=gsa.variant_fn("fused_recurrent"), variant="fused_recurrent")]
    rows = run_case(gsa, c, impls, torch.device(DEVICE), checks=("segments", "options"))
    bad = [(r["check"], r["tensor"], r["message"]) for r in rows if r["verdict"] not in ("PASS",)]
    assert not bad, bad


def _zt_zeroed_at_the_last_row_and_head(q, k, v, scale=None, initial_state=None, output_final_state=False,
                                        normalize=False, cu_seqlens=None):
    """chunk_linear_attn, but with normalize its final key sum zt [B, 1, H, K] is zero at the last
    row and head."""
    from fla_kernels.ops.linear_attn import chunk_linear_attn
    o, final = chunk_linear_attn(q, k, v, scale, initial_state, output_final_state, normalize, cu_seqlens)
    if normalize and final is not None:
        ht, zt = final
        zt = zt.clone()
        zt[-1, :, -1] = 0.0
        final = (ht, zt)
    return o, final


def test_a_state_laid_out_b_1_h_k_is_sampled_and_compared():
    """Linear attention's normaliser state z [B, 1, H, K] is taken at the sampled rows and head:
    with normalize, a sampled case's options rows pass for our kernel, and one whose zt is wrong
    only at the last row and head fails there."""
    assert sampling.Sample((0, 2), 1).take(("B", 1, "H", "K"), torch.arange(24.0).reshape(3, 1, 2, 4)).tolist() == [
        [[[4.0, 5.0, 6.0, 7.0]]], [[[20.0, 21.0, 22.0, 23.0]]]]
    spec = get_op("linear_attn")
    c = replace(PLAIN, op="linear_attn", K=8, V=8, T=20, h0="grad")
    good = replace(impl("baseline_like"), fn=spec.variant_fn("chunk"), variant="chunk")
    rows = run_case(spec, c, [good], torch.device(DEVICE), checks=("options",))
    normalized = [r for r in rows if r["check"] == "options" and "normalize" in r["message"] + r["tensor"]]
    assert {r["tensor"] for r in normalized} >= {"zt (normalize)", "dz0 (normalize)"}
    assert {r["verdict"] for r in normalized} == {"PASS"}, [r["message"] for r in normalized]
    wrong = replace(good, fn=_zt_zeroed_at_the_last_row_and_head)
    rows = run_case(spec, c, [wrong], torch.device(DEVICE), checks=("options",))
    failed = {r["tensor"] for r in rows if r["verdict"] == "FAIL"}   # zeroed, zt passes dk and dz0 nothing
    assert failed == {"zt (normalize)", "dk (normalize)", "dz0 (normalize)"}, failed
