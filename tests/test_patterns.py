"""The sentences that say what a run's failures share (reports/patterns.py), each shown to appear
on the rows it describes and to stay silent on rows that only look alike."""
import pytest

from harness.schema import FINAL_STATE_UNUSED as FINAL
from reports import render_html, render_markdown, render_terminal
from reports.patterns import failure_patterns
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


def test_fp32_errors_at_tf32_precision_are_named_and_others_are_not():
    [sentence] = failure_patterns(frame(grid(lambda T, g, h: True, dtype="fp32", rel=1.1e-3)))
    assert sentence.endswith("their relative errors (median 0.0011) are those of tf32 products "
                             "(10-bit mantissa), not of fp32.")
    assert failure_patterns(frame(grid(lambda T, g, h: True, dtype="fp32", rel=0.9))) == []
    assert failure_patterns(frame(grid(lambda T, g, h: True, dtype="bf16", rel=1.1e-3))) == []


def test_failures_only_across_segments_point_at_the_state_handed_between_calls():
    ok = grid(lambda T, g, h: False)
    seg = [golden(4096, "normal", "none", "dk", True, check="segments")]
    [sentence] = failure_patterns(frame(ok + seg))
    assert sentence.startswith("rwkv6 chunk bf16: dk fails only when the sequence is split")
    broken = grid(lambda T, g, h: T == 4096)
    assert not any("split" in s for s in failure_patterns(frame(broken + seg)))


def test_a_passing_run_has_no_sentences_and_every_report_shows_them():
    assert failure_patterns(frame(grid(lambda T, g, h: False))) == []
    df = frame(grid(lambda T, g, h: g == "strong"))
    sentence = "rwkv6 chunk bf16: dk, dv fail only under strong decay."
    assert sentence in render_terminal(df)
    assert sentence in render_markdown(df)
    assert sentence in render_html(df, plots=False)
