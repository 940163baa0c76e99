"""A sweep fails each planted kernel of tests/planted_kernels.py on the row its bug is in (the
packed case, the narrow head) and passes it everywhere else."""
import pytest
import torch

from harness.cases import expand
from harness.declaration import load_function
from harness.registry import get_op
from harness.runner import Implementation, run_case
from tests.kernel_testing import DEVICE

GLA = get_op("gla")


def sweep(planted, variant, **axes):
    """{case_id: set of the failing (check, tensor)} of the planted kernel over the cpu preset's
    cases with `axes` replaced."""
    impl = Implementation(variant, f"tests.planted_kernels:{planted}",
                          load_function(f"tests.planted_kernels:{planted}"))
    failed = {}
    for case in expand(GLA, ["fp32"], "cpu", {"h0": ["grad"], "gate": ["normal"], **axes}, 0):
        rows = run_case(GLA, case, [impl], torch.device(DEVICE), checks=())
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
