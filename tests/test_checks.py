"""The checks beyond the golden: inputs untouched, determinism, unwritten memory, segments.

Each is run on a correct implementation (every row passes) and on one with the planted bug it
exists for (the right check fails, naming the right tensor, in a sentence that says what is wrong).
"""
import pandas as pd
import pytest
import torch

from fla_kernels.utils import interpreting
from harness.cases import Case
from harness.allocations import nan_filled_allocations
from harness.checks.bits import bitwise_equal, describe_difference
from harness.checks.causality import cut as causality_cut, later_tokens_replaced
from harness.checks.segments import segment_bounds
from harness.declaration import load_function
from harness.gate import BASELINE_DIR
from harness.registry import OPS
from harness.runner import Implementation, run_case
from tests.kernel_testing import DEVICE
from tests.planted import CPU, SPEC, case, impl


def rows_of(rows, check):
    return [r for r in rows if r["check"] == check]


def test_bitwise_equal_sees_one_ulp_and_nan_payloads():
    x = torch.randn(5)
    y = x.clone()
    y[2] = torch.nextafter(y[2], torch.tensor(1e9))
    assert bitwise_equal(x, x.clone()) and not bitwise_equal(x, y)
    assert not bitwise_equal(x, x.double())
    assert describe_difference(x, y).startswith("1 of 5 elements, max |diff| ")
    nan = torch.full((3,), float("nan"))
    assert bitwise_equal(nan, nan.clone())


def test_segment_bounds_cover_the_sequence_with_unaligned_cuts():
    assert segment_bounds(1) == []
    assert segment_bounds(2) == [(0, 1), (1, 2)]
    assert segment_bounds(65) == [(0, 21), (21, 65)]


def test_allocations_inside_the_package_are_poisoned_and_restored_after():
    planted = {"__name__": "fla_kernels.planted", "torch": torch}
    exec("def alloc():\n    return torch.empty(4), torch.empty(3, dtype=torch.int32), "
         "torch.empty_like(torch.zeros(2)), torch.zeros(2).new_empty(2)", planted)
    empty = torch.empty
    with nan_filled_allocations():
        floats, ints, like, new = planted["alloc"]()
        outside = torch.zeros(3)
    assert floats.isnan().all() and like.isnan().all() and new.isnan().all()
    assert ints.dtype == torch.int32 and not outside.isnan().any()
    assert torch.empty is empty


def test_correct_implementation_passes_every_check():
    rows = run_case(SPEC, case(), [impl("baseline_like")], CPU)
    assert {r["check"] for r in rows} == {"golden", "aggregate", "inputs", "determinism", "segments",
                                          "causality", "inference", "options", "layer"}
    assert len(rows_of(rows, "segments")) == len(rows_of(rows, "golden")) == 8
    assert {r["tensor"] for r in rows_of(rows, "inference")} == {"o", "ht"}
    options = {r["tensor"] for r in rows_of(rows, "options")}
    assert "dk (no final state)" in options and "ht (no final state)" not in options
    assert "ht (final state not in the loss)" in options and "dh0 (initial state without gradient)" \
        not in options and "dk (initial state without gradient)" in options
    assert len(options) == 7 + 8 + 7
    assert all(r["verdict"] == "PASS" for r in rows), [(r["check"], r["tensor"], r["message"])
                                                      for r in rows if r["verdict"] != "PASS"]


def test_a_kernel_writing_into_its_input_is_named():
    (row,) = rows_of(run_case(SPEC, case(), [impl("writes_into_input")], CPU), "inputs")
    assert row["verdict"] == "FAIL" and row["tensor"] == "k"
    assert row["message"].startswith("the kernel wrote into its input k (")
    assert "changed" in row["message"]


def test_a_nondeterministic_kernel_fails_determinism_only():
    rows = run_case(SPEC, case(), [impl("nondeterministic")], CPU)
    (row,) = rows_of(rows, "determinism")
    assert row["verdict"] == "FAIL" and row["tensor"] == "o"
    assert row["message"].startswith("o differs between two identical runs: 1 of 960 elements, "
                                     "max |diff| ")
    assert all(r["verdict"] == "PASS" for r in rows_of(rows, "golden"))


def test_segments_catch_a_kernel_that_ignores_its_initial_state_even_without_one():
    rows = run_case(SPEC, case(h0="none"), [impl("ignores_initial_state")], CPU)
    assert all(r["verdict"] == "PASS" for r in rows_of(rows, "golden"))
    segments = {r["tensor"]: r for r in rows_of(rows, "segments")}
    assert segments["o"]["verdict"] == "FAIL"
    assert segments["o"]["message"].startswith("over segments [0,13) [13,40): err ")


def test_segments_catch_a_dropped_initial_state_gradient_through_the_chain():
    """Without an initial state there is no dh0 row; the chained segments still expose the bug."""
    rows = run_case(SPEC, case(h0="none"), [impl("drops_initial_state_grad")], CPU)
    assert all(r["verdict"] == "PASS" for r in rows_of(rows, "golden"))
    failed = {r["tensor"] for r in rows_of(rows, "segments") if r["verdict"] == "FAIL"}
    assert failed == {"dk", "dv", "dw"}  # the inputs that build the carried state


def test_inference_catches_a_kernel_whose_no_grad_path_drops_the_initial_state():
    """Every row of the run under autograd passes; the forward under no_grad fails on o (ht has
    forgotten its initial state after 40 steps of this decay and passes)."""
    rows = run_case(SPEC, case(), [impl("inference_ignores_initial_state")], CPU)
    others = [r for r in rows if r["check"] != "inference"]
    assert all(r["verdict"] == "PASS" for r in others), [(r["check"], r["tensor"]) for r in others
                                                         if r["verdict"] != "PASS"]
    inference = {r["tensor"]: r for r in rows_of(rows, "inference")}
    assert set(inference) == {"o", "ht"}
    assert inference["o"]["verdict"] == "FAIL", inference["o"]
    assert inference["o"]["message"].startswith("under no_grad: err ")
    assert inference["o"]["first_bad"].startswith("(b=0, t=0,")


def test_unwritten_output_reads_as_nan():
    """A kernel in the package that leaves the last step of o unwritten fails with that step."""
    planted = {"__name__": "fla_kernels.planted", "torch": torch,
               "baseline_like": load_function("tests.implementations:baseline_like")}
    exec("def forgets_last_step(r, k, v, w, u, **kw):\n"
         "    o, ht = baseline_like(r, k, v, w, u, **kw)\n"
         "    out = torch.empty(o.shape, dtype=o.dtype)\n"
         "    out[:, :-1] = o[:, :-1]\n"
         "    return out, ht\n", planted)
    rows = run_case(SPEC, case(h0="none"), [Implementation("chunk", "planted", planted["forgets_last_step"])],
                    CPU)
    o = {r["tensor"]: r for r in rows_of(rows, "golden")}["o"]
    assert o["verdict"] == "FAIL" and o["first_bad"].startswith("(b=0, t=39,")
    assert "NaN" in o["message"]


def test_a_backward_that_needs_the_final_state_gradient_errors_only_without_it():
    rows = run_case(SPEC, case(), [impl("needs_final_state_gradient")], CPU)
    bad = {(r["check"], r["tensor"]): r for r in rows if r["verdict"] != "PASS"}
    assert set(bad) == {("options", ""), ("layer", "")}  # a layer's loss leaves its cached state out
    assert all(r["verdict"] == "ERROR" for r in bad.values())
    assert bad[("options", "")]["message"].startswith("with final state not in the loss: backward raised "
                                                         "AttributeError")
    assert bad[("layer", "")]["message"].startswith("the layer's forward and backward raised AttributeError")


# Checks added since the H100 baselines were last written on the GPU: their rows join at the next
# `gate --device-class h100 --update-baseline` (the next lease), and this set empties.
NOT_YET_IN_H100_BASELINES = {"causality"}


@pytest.mark.parametrize("op", sorted(OPS))
def test_our_kernels_pass_every_check(op):
    """Every variant of every op, through every check (segments, options, determinism...): no row
    fails. bf16, an initial state with gradient, T not a multiple of any chunk. The op's CPU and
    H100 baselines hold rows of each of those checks (one added without them goes ungated)."""
    spec = OPS[op]
    c = Case(op=op, dtype="bf16", B=1, T=20, H=2, K=16, V=16, h0="grad", gate="normal", seed=0,
             **{s: 16 for s in spec.symbols})
    impls = [Implementation(v, "ours", spec.variant_fn(v)) for v in spec.variants]
    rows = run_case(spec, c, impls, torch.device(DEVICE))
    expected = {"golden", "aggregate", "agreement", "inputs", "determinism", "segments", "causality",
                "inference", "options", "layer"}
    expected -= {"determinism"} if interpreting() else set()   # the interpreter runs serially
    expected -= {"agreement"} if len(impls) == 1 else set()
    expected -= set() if spec.layer is not None else {"layer"}
    assert {r["check"] for r in rows} == expected
    assert all(r["verdict"] == "PASS" for r in rows), [(r["variant"], r["check"], r["tensor"], r["message"])
                                                      for r in rows if r["verdict"] != "PASS"]
    for klass in ("cpu", "h100"):
        held = set(pd.read_csv(BASELINE_DIR / klass / f"{op}.csv", usecols=["check"])["check"])
        missing = expected - held - ({"determinism"} if klass == "cpu" else NOT_YET_IN_H100_BASELINES)
        assert not missing, f"baselines/{klass}/{op}.csv has no {sorted(missing)} rows: gate --update-baseline"


def test_layer_check_passes_a_correct_kernel_and_names_what_a_broken_one_breaks():
    """The rwkv6 layer around the kernel: one call and two cache segments against a float64 layer
    golden (output and every parameter gradient), cache and input untouched, truncated training."""
    good = rows_of(run_case(SPEC, case("fp32"), [impl("baseline_like")], CPU, checks=("layer",)), "layer")
    tensors = {r["tensor"] for r in good}
    assert {"y", "y (segments)", "dr_proj.weight", "dbonus (segments)", "cache", "training"} <= tensors
    assert all(r["verdict"] == "PASS" for r in good), [(r["tensor"], r["message"]) for r in good
                                                      if r["verdict"] != "PASS"]
    bad = rows_of(run_case(SPEC, case("fp32"), [impl("ignores_initial_state")], CPU, checks=("layer",)),
                  "layer")
    failed = {r["tensor"]: r for r in bad if r["verdict"] != "PASS"}
    assert "y (segments)" in failed and "y" not in failed
    assert failed["y (segments)"]["message"].startswith("through the cache (segments): err ")


def test_layer_check_takes_a_state_returned_as_a_list():
    """fla's gsa returns its two final states as a list, not a tuple: the layer check hands it
    through the cache like a tuple instead of calling the list's .detach()."""
    spec = OPS["gsa"]
    ours = spec.variant_fn("fused_recurrent")

    def state_as_list(*args, **kwargs):
        o, state = ours(*args, **kwargs)
        return o, None if state is None else list(state)

    c = Case(op="gsa", dtype="fp32", B=1, T=20, H=1, K=16, V=16, h0="none", gate="normal", seed=0, M=16)
    rows = rows_of(run_case(spec, c, [Implementation("fused_recurrent", "as_list", state_as_list)],
                            torch.device(DEVICE), checks=("layer",)), "layer")
    assert {"y (segments)", "cache", "training"} <= {r["tensor"] for r in rows}
    assert all(r["verdict"] == "PASS" for r in rows), [(r["tensor"], r["message"]) for r in rows
                                                      if r["verdict"] != "PASS"]


def test_segments_are_bounded_by_a_baseline_chained_through_the_same_segments():
    """fp16, strong decay: the chain's final chunk holds 44 tokens where one call's holds 1, so the
    same-dtype arithmetic's ht error grows 40-fold. That arithmetic itself must pass."""
    spec = OPS["gla"]
    chunked = load_function(spec.reference_chunked)

    def same_dtype_arithmetic(*args, **kw):
        return chunked(*args, chunk_size=64, operand_dtype=torch.float16, **kw)

    c = Case(op="gla", dtype="fp16", B=2, T=65, H=4, K=64, V=64, h0="none", gate="strong", seed=0)
    rows = run_case(spec, c, [Implementation("chunk", "fp16 arithmetic", same_dtype_arithmetic)], CPU,
                    checks=("segments",))
    segments = {r["tensor"]: r for r in rows_of(rows, "segments")}
    golden = {r["tensor"]: r for r in rows_of(rows, "golden")}
    assert segments["ht"]["err"] > 20 * golden["ht"]["err"]
    assert all(r["verdict"] == "PASS" for r in rows), [(r["check"], r["tensor"], r["message"])
                                                      for r in rows if r["verdict"] != "PASS"]


def test_causality_catches_o_that_depends_on_later_tokens_by_a_rounding():
    """A kernel whose o before a token moves with the inputs after it, by a rounding of r: every
    golden row stays within its bound; causality fails, naming the token and the difference."""
    rows = run_case(SPEC, case(dtype="bf16"), [impl("anchored_on_the_chunk_end")], CPU)
    (row,) = rows_of(rows, "causality")
    assert row["verdict"] == "FAIL" and row["tensor"] == "o", row
    assert row["message"].startswith("o before token 13 changed when the inputs from token 13 on did: ")
    assert all(r["verdict"] == "PASS" for r in rows_of(rows, "golden")), [
        (r["tensor"], r["ratio"]) for r in rows_of(rows, "golden") if r["verdict"] != "PASS"]


def test_causality_cannot_tell_for_a_forward_that_is_not_deterministic():
    (row,) = rows_of(run_case(SPEC, case(), [impl("nondeterministic")], CPU), "causality")
    assert row["verdict"] == "SKIP" and row["message"].startswith("cannot tell: two unchanged forwards differ")


def test_later_tokens_are_replaced_by_earlier_ones_and_the_earlier_left_alone():
    x = torch.arange(7.0)[None, :, None]
    assert later_tokens_replaced(x, 3).flatten().tolist() == [0, 1, 2, 2, 1, 0, 2]
    assert later_tokens_replaced(x, 1).flatten().tolist() == [0] * 7
    assert causality_cut(2) == 1 and causality_cut(65) == 21
