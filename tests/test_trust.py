"""What a kernel author must be able to trust about the harness itself: a wrong return is named
before backward, the forward rows that can be computed are kept, determinism runs wherever it can
show something, every FAIL row says where, and errors of one sign that each element hides fail
the gradient's sums, and only those."""
import pytest

from harness.runner import run_case
from tests.planted import CPU, SPEC, case, impl


def rows_of(name, **kw):
    return run_case(SPEC, case(**kw), [impl(name)], CPU, checks=())


def test_an_output_one_step_short_is_an_error_row_naming_it_and_the_right_state_is_kept():
    rows = rows_of("o_one_step_short")
    (error,) = [r for r in rows if r["verdict"] == "ERROR"]
    assert (error["check"], error["tensor"]) == ("run", "o")
    assert error["message"] == ("returned wrong: o has shape (2, 39, 2, 6) [B, T, H, V]; the op's is "
                                "(2, 40, 2, 6) [B, T, H, V]")
    assert [(r["check"], r["tensor"], r["verdict"]) for r in rows if r is not error] == [
        ("golden", "ht", "PASS")]


def test_a_call_that_returns_one_tensor_is_named():
    (error,) = rows_of("returns_o_only")
    assert error["verdict"] == "ERROR" and error["tensor"] == "o"
    assert "returned a Tensor; the op returns the pair (o, final state)" in error["message"]


def test_a_backward_that_raises_keeps_the_forward_rows():
    rows = rows_of("raises_in_backward")
    assert [(r["tensor"], r["verdict"]) for r in rows] == [("o", "PASS"), ("ht", "PASS"), ("", "ERROR")]
    assert rows[-1]["message"] == "backward raised RuntimeError: planted failure in backward"


def test_a_forward_only_implementation_gets_its_forward_checked_and_a_skip_row_for_its_gradients():
    rows = rows_of("forward_only")
    assert [(r["tensor"], r["verdict"]) for r in rows] == [("o", "PASS"), ("ht", "PASS"), ("", "SKIP")]
    assert rows[-1]["message"].startswith("no backward: it raised NotImplementedError: this function has no backward")


def test_outputs_without_a_gradient_are_a_forward_only_implementation_too():
    rows = rows_of("outside_autograd")
    assert [(r["tensor"], r["verdict"]) for r in rows] == [("o", "PASS"), ("ht", "PASS"), ("", "SKIP")]
    assert rows[-1]["message"] == "no backward: its outputs carry no gradient (computed outside autograd)"


def test_output_an_external_implementation_leaves_unwritten_reads_as_nan():
    """Any implementation's package gets NaN-filled allocations, not only ours: upstream output
    left unwritten shows as NaN at the token it missed, never as stale memory that may pass."""
    (o,) = [r for r in rows_of("last_token_unwritten") if r["tensor"] == "o"]
    assert o["verdict"] == "FAIL" and o["nan"] == 2 * 2 * 6
    assert o["first_bad"] == "(b=0, t=39, h=0)" and "NaN" in o["message"]


@pytest.mark.parametrize("name", ["nondeterministic"])
def test_determinism_runs_for_implementations_that_are_not_our_interpreted_kernels(name):
    rows = run_case(SPEC, case(), [impl(name)], CPU, checks=("determinism",))
    (row,) = [r for r in rows if r["check"] == "determinism"]
    assert row["verdict"] == "FAIL" and row["tensor"] == "o"


def test_determinism_is_left_out_for_our_kernels_only_under_the_interpreter(monkeypatch):
    from fla_kernels.utils import interpreting
    from harness.checks.determinism import can_race
    from harness.runner import Implementation
    ours = Implementation("chunk", "ours", None)
    theirs = Implementation("chunk", "pkg:chunk", None)
    assert can_race(theirs)
    assert can_race(ours) == (not interpreting())


def test_every_fail_row_names_its_worst_element():
    rows = [r for r in rows_of("gate_grad_scaled", dtype="bf16") if r["verdict"] == "FAIL"]
    assert rows and all(r["first_bad"] for r in rows)
    golden = next(r for r in rows if r["check"] == "golden")
    assert golden["tensor"] == "dw" and golden["first_bad"].startswith("(b=")


def test_a_gate_gradient_biased_by_half_a_rounding_fails_its_sums_and_nothing_else():
    rows = rows_of("gate_grad_rounded_up", dtype="bf16", T=200)
    failing = {(r["check"], r["tensor"]) for r in rows if r["verdict"] != "PASS"}
    assert ("aggregate", "dw (sum over b, t, h)") in failing
    assert failing <= {("aggregate", "dw (sum over t)"), ("aggregate", "dw (sum over b, t, h)")}
    assert all(r["message"].startswith("the sum over ") for r in rows if r["verdict"] == "FAIL")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_correct_implementation_passes_every_aggregate_row(dtype):
    rows = rows_of("baseline_like", dtype=dtype, T=130)
    sums = [r for r in rows if r["check"] == "aggregate"]
    assert {r["tensor"] for r in sums} == {f"d{x} (sum over {over})" for x in "rkvw"
                                          for over in ("t", "b, t, h")}
    assert all(r["verdict"] == "PASS" for r in sums)
