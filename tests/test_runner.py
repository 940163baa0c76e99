"""run_case on correct and on planted-bug implementations: the right verdict on the right row."""
import pytest

from harness.cases import Case
from harness.declaration import load_function
from harness.registry import OPS
from harness.runner import Implementation, run_case
from tests.planted import CPU, SPEC, case, impl


def by_tensor(rows, check="golden"):
    return {r["tensor"]: r for r in rows if r["check"] == check}


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("gate", ["normal", "strong", "weak"])
def test_correct_implementation_passes_every_row(dtype, gate):
    rows = run_case(SPEC, case(dtype, gate=gate), [impl("baseline_like")], CPU)
    assert set(by_tensor(rows)) == {"o", "ht", "dr", "dk", "dv", "dw", "du", "dh0"}
    assert all(r["verdict"] == "PASS" for r in rows), [(r["tensor"], r["message"]) for r in rows
                                                      if r["verdict"] != "PASS"]


def test_long_sequence_uses_chunked_golden_and_passes():
    rows = run_case(SPEC, case("bf16", T=300, h0="none", gate="strong"), [impl("baseline_like")], CPU)
    assert all(r["verdict"] == "PASS" for r in rows)
    assert "dh0" not in by_tensor(rows)


def test_scaled_gate_gradient_fails_on_dw_only():
    rows = by_tensor(run_case(SPEC, case("bf16"), [impl("gate_grad_scaled")], CPU))
    assert rows["dw"]["verdict"] == "FAIL" and rows["dw"]["ratio"] > 1
    assert "bound" in rows["dw"]["message"]
    assert all(r["verdict"] == "PASS" for t, r in rows.items() if t != "dw")


def test_kernel_that_raises_becomes_an_error_row_and_others_still_run():
    rows = run_case(SPEC, case(), [impl("raises_in_backward"), impl("baseline_like", "fused_recurrent")], CPU)
    errors = [r for r in rows if r["verdict"] == "ERROR"]
    assert len(errors) == 1 and errors[0]["check"] == "run"
    assert "planted failure in backward" in errors[0]["message"]
    others = [r for r in rows if r["variant"] == "fused_recurrent"]
    assert len([r for r in others if r["check"] == "golden"]) == 8
    assert all(r["verdict"] == "PASS" for r in others)


def test_nan_output_fails_with_the_first_bad_step():
    rows = by_tensor(run_case(SPEC, case(), [impl("nan_from_t10")], CPU))
    assert rows["o"]["verdict"] == "FAIL"
    assert rows["o"]["first_bad"].startswith("(b=0, t=10,")
    assert rows["o"]["nan"] == 2 * 30 * 2 * 6


def test_dropped_initial_state_gradient_fails_on_dh0():
    rows = by_tensor(run_case(SPEC, case(), [impl("drops_initial_state_grad")], CPU))
    assert rows["dh0"]["verdict"] == "FAIL" and "None" in rows["dh0"]["message"]
    assert rows["o"]["verdict"] == "PASS"


def test_missing_final_state_fails_on_ht():
    rows = by_tensor(run_case(SPEC, case(), [impl("no_final_state")], CPU))
    assert rows["ht"]["verdict"] == "FAIL"


@pytest.mark.parametrize("name", ["through_bf16", "through_tf32"])
@pytest.mark.parametrize("T", [1, 40, 600])
def test_fp32_case_computed_at_lower_precision_fails(name, T):
    rows = by_tensor(run_case(SPEC, case("fp32", T=T), [impl(name)], CPU))
    assert rows["o"]["verdict"] == "FAIL"
    assert rows["o"]["ratio"] > 10


def test_agreement_rows_compare_the_two_variants():
    rows = run_case(SPEC, case("bf16"), [impl("baseline_like"), impl("gate_grad_scaled", "fused_recurrent")], CPU)
    agree = by_tensor(rows, "agreement")
    assert agree["o"]["verdict"] == "PASS" and agree["o"]["variant"] == "chunk~fused_recurrent"
    assert agree["dw"]["verdict"] == "FAIL"


def test_final_state_in_the_wrong_dtype_fails():
    rows = by_tensor(run_case(SPEC, case("bf16"), [impl("state_in_bf16")], CPU))
    assert rows["ht"]["verdict"] == "FAIL" and "float32" in rows["ht"]["message"]
    assert rows["o"]["verdict"] == "PASS"


@pytest.mark.parametrize("op", sorted(OPS))
def test_every_op_runs_through_the_harness_with_its_chunked_reference(op):
    """Registry, inputs, states (one or a pair), golden and baseline work for every op family."""
    spec = OPS[op]
    chunked = load_function(spec.reference_chunked)

    def reference_as_kernel(*args, **kw):
        return chunked(*args, chunk_size=32, operand_dtype=args[0].dtype, **kw)

    c = Case(op=op, dtype="bf16", B=2, T=40, H=2, K=8, V=6, h0="grad", gate="strong", seed=3,
             **{s: 16 for s in spec.symbols})
    rows = run_case(spec, c, [Implementation("chunk", "reference", reference_as_kernel)], CPU)
    names = {"o"} | set(spec.final_state_names()) | set(spec.initial_state_grad_names())
    names |= {"d" + s.name for s in spec.inputs}
    assert set(by_tensor(rows)) == names
    assert all(r["verdict"] == "PASS" for r in rows), [(r["check"], r["tensor"], r["message"])
                                                      for r in rows if r["verdict"] != "PASS"]


def test_decay_off_by_one_at_chunk_starts_fails_on_o_and_dw():
    rows = by_tensor(run_case(SPEC, case("fp32", T=70), [impl("decay_off_by_one_at_chunk_starts")], CPU))
    assert rows["o"]["verdict"] == "FAIL" and rows["dw"]["verdict"] == "FAIL"
    assert "bound" in rows["o"]["message"]
    worst_t = int(rows["o"]["first_bad"].split("t=")[1].split(",")[0])
    assert worst_t >= 32  # the bug starts at the first chunk boundary


def test_exp_overflow_passes_short_sequences_and_goes_nan_at_long_ones():
    short = by_tensor(run_case(SPEC, case("fp32", T=40, h0="none"), [impl("overflows_at_long_T")], CPU))
    assert all(r["verdict"] == "PASS" for r in short.values())
    long = by_tensor(run_case(SPEC, case("fp32", T=300, h0="none"), [impl("overflows_at_long_T")], CPU))
    assert long["o"]["verdict"] == "FAIL" and long["o"]["nan"] > 0
    assert "NaN" in long["o"]["message"] and long["o"]["first_bad"].startswith("(b=")
