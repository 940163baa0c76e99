"""A sweep fails each planted kernel of tests/planted_kernels.py on the row its bug is in (the
packed case, the narrow head, the option with an initial state) and passes it everywhere else."""
import pytest
import torch

from harness.cases import expand
from harness.declaration import load_function
from harness.registry import get_op
from harness.runner import Implementation, run_case
from tests.kernel_testing import DEVICE


def sweep(planted, variant, op="gla", **axes):
    """{case_id: set of the failing (check, tensor)} of the planted kernel over the cpu preset's
    cases with `axes` replaced."""
    spec = get_op(op)
    impl = Implementation(variant, f"tests.planted_kernels:{planted}",
                          load_function(f"tests.planted_kernels:{planted}"))
    failed = {}
    for case in expand(spec, ["fp32"], "cpu", {"h0": ["grad"], "gate": ["normal"], **axes}, 0):
        rows = run_case(spec, case, [impl], torch.device(DEVICE), checks=())
        failed[case.case_id] = {(r["check"], r["tensor"]) for r in rows if r["verdict"] != "PASS"}
    return failed


@pytest.mark.parametrize("planted", ["gla_state_not_reset_at_boundaries", "gla_length_one_sequence_skipped"])
def test_a_packing_bug_fails_the_packed_case_and_passes_the_plain_one(planted):
    failed = sweep(planted, "fused_recurrent", T=[65], KV=[(16, 16)], varlen=["none", "packed"])
    plain, packed = sorted(failed, key=lambda case_id: case_id.endswith("-packed"))
    assert not failed[plain] and ("golden", "o") in failed[packed], failed


def test_a_narrow_head_bug_fails_the_heads_narrower_than_a_dot_only():
    failed = sweep("gla_narrow_head_last_column_dropped", "chunk", T=[65])
    narrow = {"gla-fp32-B1-T65-H2-K8-V8-h0_grad-normal-s0", "gla-fp32-B1-T65-H2-K12-V20-h0_grad-normal-s0"}
    assert {case_id for case_id, bad in failed.items() if bad} == narrow, failed
    assert all(("golden", "o") in failed[case_id] for case_id in narrow)


def test_a_normaliser_that_drops_the_initial_key_sum_fails_normalize_with_an_initial_state_only():
    failed = sweep("linear_attn_normaliser_without_initial_key_sum", "chunk", op="linear_attn", T=[65],
                   KV=[(16, 16)], h0=["none", "grad"], option=["none", "normalize"])
    assert {case_id for case_id, bad in failed.items() if bad} == {
        "linear_attn-fp32-B1-T65-H2-K16-V16-h0_grad-normal-s0-normalize"}, failed
    assert {("golden", "o"), ("golden", "dz0")} <= failed["linear_attn-fp32-B1-T65-H2-K16-V16-h0_grad-normal-s0-normalize"]


def test_a_missing_gate_read_as_no_decay_fails_the_ungated_case_only():
    failed = sweep("gsa_missing_gate_as_no_decay", "chunk", op="gsa", T=[65], KV=[(16, 16)],
                   option=["none", "g=None"])
    assert {case_id for case_id, bad in failed.items() if bad} == {
        "gsa-fp32-B1-T65-H2-K16-V16-M16-h0_grad-normal-s0-g=None"}, failed
    assert ("golden", "o") in failed["gsa-fp32-B1-T65-H2-K16-V16-M16-h0_grad-normal-s0-g=None"]
