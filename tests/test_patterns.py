"""The sentences that say what a run's failures share (reports/patterns.py), each shown to appear
on the rows it describes and to stay silent on rows that only look alike."""
import pandas as pd
import pytest
import torch

from harness.runner import run_case
from reports.schema import FINAL_STATE_UNUSED as FINAL
from reports import render_html, render_markdown, render_terminal
from reports.patterns import (MAX_REL_AT_1_BIT, RMS_REL_AT_1_BIT, failure_patterns,
                              significand_bits)
from tests.implementations import _keep_bits
from tests.planted import CPU, SPEC, case, impl
from tests.test_reports import frame, row


def golden(T=63, gate="normal", h0="none", tensor="dk", fail=False, dtype="bf16", rel=None, **kw):
    case = f"rwkv6-{dtype}-T{T}-{gate}-{h0}"
    err = 1.0 if fail else 1e-3
    return row(op="rwkv6", case_id=case, T=T, gate=gate, h0=h0, tensor=tensor, dtype=dtype,
               err=err, bound=0.01, rel=rel if rel is not None else err,
               verdict="FAIL" if fail else "PASS", **kw)


def grid(failing, tensors=("dk", "dv"), dtype="bf16", rel=None):
    """Golden rows over T x gate x h0; `failing(T, gate, h0)` says which cases fail."""
    return [golden(T, g, h, t, failing(T, g, h), dtype, rel) for T in (63, 1000, 4096)
            for g in ("normal", "strong") for h in ("none", "grad") for t in tensors]


def option(tensor, fail, T=63, gate="normal", h0="none", label=FINAL, dtype="bf16"):
    return golden(T, gate, h0, f"{tensor} ({label})", fail, dtype, check="options")


def test_failures_that_pass_without_the_final_state_in_the_loss_name_its_gradient():
    rows = grid(lambda T, g, h: True) + [option("dk", False), option("dv", False)]
    [sentence] = failure_patterns(frame(rows))
    assert sentence.startswith("rwkv6 chunk bf16: dk, dv fail; they pass in the same cases when "
                               "the final state is left out of the loss")
    rows = grid(lambda T, g, h: True) + [option("dk", False), option("dv", True)]
    assert failure_patterns(frame(rows)) == []


def test_failures_under_one_gate_strength_or_initial_state_option_say_so():
    assert failure_patterns(frame(grid(lambda T, g, h: g == "strong"))) == [
        "rwkv6 chunk bf16: dk, dv fail only under strong decay."]
    assert failure_patterns(frame(grid(lambda T, g, h: h == "grad", tensors=("dk",)))) == [
        "rwkv6 chunk bf16: dk fails only with initial state 'grad'."]
    assert failure_patterns(frame(grid(lambda T, g, h: True))) == []


@pytest.mark.parametrize("failing_T, phrase", [((4096,), "at T >= 4096"),
                                               ((1000, 4096), "at T >= 1000"),
                                               ((63, 4096), "at T in {63, 4096}")])
def test_failures_at_some_lengths_name_them(failing_T, phrase):
    [sentence] = failure_patterns(frame(grid(lambda T, g, h: T in failing_T)))
    assert sentence == f"rwkv6 chunk bf16: dk, dv fail only {phrase}."


def test_fp32_errors_of_a_narrow_format_are_named_and_others_are_not():
    def sentences(rel, rms_rel, dtype="fp32"):
        rows = [dict(r, rms_rel=rms_rel) for r in grid(lambda T, g, h: True, dtype=dtype, rel=rel)]
        return failure_patterns(frame(rows))
    [sentence] = sentences(rel=1.5e-3, rms_rel=1.2e-3)  # 8.4 bits
    assert sentence.endswith("their errors (rms_rel 0.0012 in the median) are those of about 8.4 "
                             "significand bits, as products in tf32 (10 to 11 bits) would give, "
                             "not fp32 (24).")
    assert "in tf32 or fp16 (10 to 11 bits)" in sentences(rel=4e-4, rms_rel=3e-4)[0]  # 10.4 bits
    assert "in bf16 (8 bits)" in sentences(rel=4e-3, rms_rel=3e-3)[0]  # 7.1 bits
    assert sentences(rel=0.1, rms_rel=0.1) == []  # 2 bits: a wrong factor, no format's rounding
    assert sentences(rel=3e-2, rms_rel=1.2e-2) == []  # 5 bits: narrower than any format here
    assert sentences(rel=0.05, rms_rel=1.2e-3) == []  # the largest error far above the rms: no rounding
    assert sentences(rel=1.5e-3, rms_rel=1.2e-3, dtype="bf16") == []


def test_failing_rows_that_disagree_on_the_width_name_no_format():
    rows = [dict(r, rms_rel=1.2e-3 if r["T"] == 63 else 3e-3 if r["T"] == 1000 else 3e-4)
            for r in grid(lambda T, g, h: True, dtype="fp32", rel=2e-3)]
    assert failure_patterns(frame(rows)) == []


@pytest.mark.parametrize("p", [5, 8, 11])
def test_rounding_to_p_bits_gives_the_errors_the_estimates_assume(p):
    """Normal values rounded to p significand bits: rms relative error 0.4 * 2^-p, largest
    relative to the largest value about 0.8 * 2^-p, so both estimates give p back."""
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(p), dtype=torch.float64)
    err = (_keep_bits(x, p) - x).abs()
    rms_rel = (err.pow(2).mean().sqrt() / x.pow(2).mean().sqrt()).item()
    rel = (err.max() / x.abs().max()).item()
    assert rms_rel * 2 ** p == pytest.approx(RMS_REL_AT_1_BIT, rel=0.1)
    assert rel * 2 ** p == pytest.approx(MAX_REL_AT_1_BIT, rel=0.2)
    from_rms, from_max = significand_bits(pd.Series([rel]), pd.Series([rms_rel]))
    assert abs(from_rms[0] - p) < 0.2 and abs(from_max[0] - p) < 0.35


@pytest.mark.parametrize("name, named", [("through_tf32", "in tf32 (10 to 11 bits)"),
                                         ("through_bf16", "in bf16 (8 bits)"),
                                         ("gate_grad_scaled", None),
                                         ("chunk_with_coarse_gate_grad", None)])
def test_planted_fp32_kernels_are_told_by_the_width_their_errors_show(name, named):
    """Products through tf32 or bf16 are named; a gate gradient kept to 5 bits, or 0.9 of the
    truth, is neither (rows from the harness itself)."""
    cases = [case("fp32", T=T, h0=h, gate=g) for T, h, g in
             ((1, "grad", "normal"), (40, "none", "strong"), (40, "grad", "normal"))]
    df = frame([r for c in cases for r in run_case(SPEC, c, [impl(name)], CPU, checks=())])
    assert (df["verdict"] == "FAIL").any()
    text = " ".join(failure_patterns(df))
    if named:
        assert f"significand bits, as products {named} would give" in text
    else:
        assert "significand bits" not in text and "tf32" not in text and "bf16" not in text


def test_failures_only_across_segments_point_at_the_state_handed_between_calls():
    ok = grid(lambda T, g, h: False)
    seg = [golden(4096, "normal", "none", "dk", True, check="segments")]
    [sentence] = failure_patterns(frame(ok + seg))
    assert sentence.startswith("rwkv6 chunk bf16: dk fails only when the sequence is split")
    broken = grid(lambda T, g, h: T == 4096)
    assert not any("split" in s for s in failure_patterns(frame(broken + seg)))


def test_failures_only_in_the_sums_over_tokens_point_at_errors_of_one_sign():
    ok = grid(lambda T, g, h: False, tensors=("dk", "dw"))
    sums = [golden(4096, "normal", "none", "dw (sum over t)", True, check="aggregate"),
            golden(1000, "strong", "grad", "dw (sum over b, t, h)", True, check="aggregate")]
    [sentence] = failure_patterns(frame(ok + sums))
    assert sentence.startswith("rwkv6 chunk bf16: dw fails only summed over tokens (the aggregate "
                               "rows), not element by element: their errors share a sign")
    broken = grid(lambda T, g, h: T == 4096, tensors=("dk", "dw"))
    assert not any("summed" in s for s in failure_patterns(frame(broken + sums[:1])))


def test_a_passing_run_has_no_sentences_and_every_report_shows_them():
    assert failure_patterns(frame(grid(lambda T, g, h: False))) == []
    df = frame(grid(lambda T, g, h: g == "strong"))
    sentence = "rwkv6 chunk bf16: dk, dv fail only under strong decay."
    assert sentence in render_terminal(df)
    assert sentence in render_markdown(df)
    assert sentence in render_html(df, plots=False)
