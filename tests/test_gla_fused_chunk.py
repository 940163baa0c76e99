"""fused_chunk_gla against the float64 recurrent reference: outputs, final state, every gradient.

fused_chunk_gla is the variant that went NaN upstream at T=43884 (H=1, K=V=64, bf16, strong decay);
`test_long_sequence_under_strong_decay` is that case scaled to what the interpreter can run.
Runs on CPU through the Triton interpreter (set by `import fla_kernels` when CUDA is absent), so
shapes stay small. The GLA spec and the checks live in tests/gla_spec.py (shared with the chunk
tests), on top of tests/kernel_testing.py: inputs generated in the kernel's dtype and upcast exactly to
float64 for the reference, one shared upstream gradient for o and one for the final state,
max|X - X64| <= REL_TOL[dtype] * max|X64|.
"""
from __future__ import annotations

import pytest
import torch

from fla_kernels.ops.gla import fused_chunk_gla
from tests import gla_spec
from tests.gla_spec import BAD_ARGUMENTS, HALF_SHAPES, SHAPES, STRONG_SHAPES, check_case


@pytest.mark.parametrize("B,T,H,K,V,use_h0,output_final_state", SHAPES)
def test_fp32_matches_float64_reference(B, T, H, K, V, use_h0, output_final_state):
    check_case(fused_chunk_gla, B, T, H, K, V, torch.float32, "normal", use_h0, output_final_state)


@pytest.mark.parametrize("gate", ["strong", "extreme"])
@pytest.mark.parametrize("B,T,H,K,V", STRONG_SHAPES)
def test_fp32_strong_decay_is_finite_and_accurate(B, T, H, K, V, gate):
    check_case(fused_chunk_gla, B, T, H, K, V, torch.float32, gate, use_h0=True, output_final_state=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("gate", ["normal", "strong"])
@pytest.mark.parametrize("B,T,H,K,V,use_h0", HALF_SHAPES)
def test_half_precision_matches_float64_reference(B, T, H, K, V, use_h0, gate, dtype):
    check_case(fused_chunk_gla, B, T, H, K, V, dtype, gate, use_h0, output_final_state=True)


@pytest.mark.parametrize("gate", ["strong", "extreme"])
def test_long_sequence_under_strong_decay(gate):
    """bf16, H = 1, many chunks walked in registers: finite and within tolerance everywhere."""
    check_case(fused_chunk_gla, 1, 320, 1, 16, 16, torch.bfloat16, gate, use_h0=True,
               output_final_state=True)


def test_gradient_from_final_state_alone():
    gla_spec.check_gradient_from_final_state_alone(fused_chunk_gla)


def test_only_requested_gradients_are_returned():
    gla_spec.check_only_requested_gradients(fused_chunk_gla)


def test_scale_is_passed_through():
    gla_spec.check_scale(fused_chunk_gla)


def test_inputs_unchanged_and_results_deterministic():
    gla_spec.check_unchanged_and_deterministic(fused_chunk_gla)


def test_non_contiguous_inputs():
    gla_spec.check_non_contiguous(fused_chunk_gla)


@pytest.mark.parametrize("bad", BAD_ARGUMENTS)
def test_bad_arguments_raise_value_error(bad):
    gla_spec.check_bad_argument(fused_chunk_gla, "fused_chunk_gla", bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel tests compile every kernel")
def test_every_launched_kernel_compiles_for_sm90():
    gla_spec.check_compiles_for_sm90(fused_chunk_gla)
