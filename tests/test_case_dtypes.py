"""Mixed dtypes ("bf16-fp32gates": 16-bit q, k, v beside float32 gates, as layers produce them):
drawn in their own dtypes, their gradients held to their own dtype's contract (autograd hands a
leaf its gradient in the leaf's dtype whatever a backward returns), and a kernel that reads the
float32 gate in bf16 caught."""
from dataclasses import replace

import torch

from harness.cases import Case
from harness.inputs import make_inputs
from harness.runner import run_case
from tests.planted import CPU, SPEC, case, impl

MIXED = replace(case(T=40, gate="strong"), dtype="bf16-fp32gates")


def test_a_mixed_case_draws_its_gates_in_float32_and_the_rest_in_bf16():
    drawn = make_inputs(SPEC, MIXED, CPU)
    assert {name: x.dtype for name, x in drawn.tensors.items()} == {
        "r": torch.bfloat16, "k": torch.bfloat16, "v": torch.bfloat16, "w": torch.float32, "u": torch.bfloat16}
    assert drawn.do.dtype == torch.bfloat16
    assert MIXED.activation_dtype == "bf16" and MIXED.gate_dtype == torch.float32


def test_a_correct_implementation_passes_a_mixed_case_with_the_gate_gradient_in_float32():
    rows = run_case(SPEC, MIXED, [impl("baseline_like")], CPU, checks=())
    assert rows and all(r["verdict"] == "PASS" for r in rows)


def test_a_float32_gate_read_in_bf16_fails_the_float32_final_state():
    rows = run_case(SPEC, MIXED, [impl("gate_rounded_to_activations")], CPU, checks=())
    failed = {r["tensor"] for r in rows if r["check"] == "golden" and r["verdict"] == "FAIL"}
    assert "ht" in failed, failed


def test_mixed_dtype_names_keep_their_case_ids():
    assert Case(op="gla", dtype="fp16-fp32gates", B=1, T=2, H=1, K=8, V=8, h0="none", gate="normal",
                seed=0).case_id == "gla-fp16-fp32gates-B1-T2-H1-K8-V8-h0_none-normal-s0"
