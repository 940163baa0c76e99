"""Packed variable-length batches, the harness side: the sequences a packed case draws, references
run sequence by sequence, the packing check, locations named by sequence, and SKIP rows for an
implementation that does not take packing. Planted implementations (tests/implementations.py)
carry the bugs a varlen kernel has: a state carried across a boundary, a length-1 sequence
mishandled, a boundary read one token early, a packed path rounding what its plain path does not."""
import re
from dataclasses import replace

import pytest
import torch

from harness.cases import Case
from harness.inputs import make_inputs, packed_lengths
from harness.packing import CHUNK, name_sequences, sequence_lengths
from harness.runner import run_case
from tests.planted import CPU, SPEC, case, impl

PACKED = replace(case(T=40), varlen="packed")   # 80 tokens in one row


def failing(rows, check="golden"):
    return {r["tensor"]: r for r in rows if r["check"] == check and r["verdict"] == "FAIL"}


@pytest.mark.parametrize("total, count", [(1, 3), (2, 3), (3, 5), (17, 2), (65, 4), (80, 6), (200, 3),
                                          (4096, 5), (131072, 4100)])
def test_sequence_lengths_cover_the_tokens_with_the_hard_cases(total, count):
    lengths = sequence_lengths(total, count, torch.Generator().manual_seed(total))
    assert sum(lengths) == total and min(lengths) >= 1 and len(lengths) == min(total, count)
    assert 1 in lengths or count == 1
    if total >= count + CHUNK + 1 and count > 2:
        assert max(lengths) > CHUNK
    assert lengths == sequence_lengths(total, count, torch.Generator().manual_seed(total))


def test_a_packed_case_draws_the_unpacked_case_s_numbers_in_one_row():
    plain, packed = make_inputs(SPEC, case(T=40), CPU), make_inputs(SPEC, PACKED, CPU)
    lengths = packed_lengths(PACKED)
    assert packed.bounds == [0, *torch.tensor(lengths).cumsum(0).tolist()]
    assert packed.cu_seqlens.dtype == torch.int32
    for name, x in plain.tensors.items():
        y = packed.tensors[name]
        assert torch.equal(y, x.reshape(1, 80, *x.shape[2:]) if name != "u" else x), name
    assert packed.initial_states[0].shape == (len(lengths), 2, 8, 6)
    assert packed.do.shape == (1, 80, 2, 6) and packed.longest == max(lengths)


def test_a_correct_packed_implementation_passes_golden_and_packing_rows():
    rows = run_case(SPEC, PACKED, [impl("packed_like")], CPU, checks=("packing",))
    assert {r["verdict"] for r in rows} == {"PASS"}
    assert {r["tensor"] for r in rows if r["check"] == "packing"} == {"o", "ht", "dr", "dk", "dv", "dw",
                                                                     "du", "dh0"}
    assert all(r["case_id"].endswith("-packed") and r["varlen"] == "packed" for r in rows)


@pytest.mark.parametrize("name, tensors", [
    ("packed_state_crosses_boundaries", {"o", "ht", "dh0"}),
    ("packed_length_one_zeroed", {"o"}),
    ("packed_boundary_one_early", {"o", "ht"}),
])
def test_planted_packing_bugs_fail_on_the_tensors_they_break(name, tensors):
    rows = run_case(SPEC, PACKED, [impl(name)], CPU, checks=())
    bad = failing(rows)
    assert tensors <= set(bad), sorted(bad)
    assert "sequence" in bad["o"]["first_bad"], bad["o"]


def test_a_failure_names_the_sequence_of_a_length_one_sequence():
    lengths = packed_lengths(PACKED)
    row = failing(run_case(SPEC, PACKED, [impl("packed_length_one_zeroed")], CPU, checks=()))["o"]
    where = re.fullmatch(rf"\(sequence (\d+) of {len(lengths)}: t=0 of 1, h=\d\)", row["first_bad"])
    assert where and lengths[int(where.group(1))] == 1, row["first_bad"]


def test_the_packing_check_fails_a_packed_path_that_differs_from_the_plain_one():
    rows = run_case(SPEC, PACKED, [impl("packed_path_in_bf16")], CPU, checks=("packing",))
    packing = failing(rows, "packing")
    assert "o" in packing and "ht" not in packing   # (the cast rounds the gradients it hands back too)
    assert packing["o"]["message"].startswith("packed against one by one: variants differ")


def test_an_implementation_without_packing_gets_a_skip_row_not_an_error():
    rows = run_case(SPEC, PACKED, [impl("baseline_like"), impl("packed_not_implemented")], CPU, checks=())
    skips = [r for r in rows if r["verdict"] == "SKIP"]
    assert len(skips) == 2 and len(rows) == 2
    assert "does not take packed sequences (cu_seqlens)" in skips[0]["message"]
    assert "rejects this case's call: NotImplementedError: cu_seqlens is not supported" in skips[1]["message"]


def test_not_implemented_is_an_error_on_a_plain_case():
    rows = run_case(SPEC, case(T=40), [impl("raises_not_implemented")], CPU, checks=())
    assert [r["verdict"] for r in rows] == ["ERROR"]


def test_places_in_a_packed_row_are_named_by_sequence():
    metrics = {"first_bad": "(b=0, t=5, h=1)", "message": "NaN first at (b=0, t=5, h=1)", "err": 1.0}
    named = name_sequences(metrics, [0, 1, 4, 10])
    assert named["first_bad"] == "(sequence 2 of 3: t=1 of 6, h=1)"
    assert named["message"] == "NaN first at (sequence 2 of 3: t=1 of 6, h=1)"
    assert name_sequences(metrics, None) is metrics


def test_a_packed_case_id_reads_back():
    from harness.repro import parse_case_id
    c = Case(op="gsa", dtype="bf16-fp32gates", B=1, T=65, H=2, K=16, V=16, h0="grad", gate="normal",
             seed=0, M=16, varlen="packed", option="g=None")
    assert c.case_id == "gsa-bf16-fp32gates-B1-T65-H2-K16-V16-M16-h0_grad-normal-s0-packed-g=None"
    assert parse_case_id(c.case_id) == c
