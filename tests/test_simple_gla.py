"""Simple GLA's kernels without a gate (g=None): linear attention. The checks every kernel keeps are
in tests/test_kernels.py."""
import pytest
import torch

from fla_kernels.ops.common.fused_recurrent import CHUNK
from fla_kernels.ops.simple_gla.chunk import BT
from harness.registry import get_op
from tests.kernel_testing import assert_matches_reference, make_inputs, reference, run

SIMPLE_GLA, LINEAR_ATTN = get_op("simple_gla"), get_op("linear_attn")


@pytest.mark.parametrize("variant,dtype,T", [
    pytest.param("chunk", torch.float32, BT + 3, id="chunk-fp32"),
    pytest.param("chunk", torch.bfloat16, BT + 3, id="chunk-bf16"),
    pytest.param("fused_recurrent", torch.float32, CHUNK + 3, id="fused_recurrent-fp32"),
])
def test_without_gate_is_linear_attention(variant, dtype, T):
    """g=None: backward runs and returns None in the gate's place (the gradient tuple keeps its
    length); every tensor matches the reference and equals linear attention's kernel of the same
    variant bit for bit (the same kernels without a gate)."""
    fn, linear = SIMPLE_GLA.variant_fn(variant), LINEAR_ATTN.variant_fn(variant)
    x = make_inputs(SIMPLE_GLA, 1, T, 2, 16, 24, dtype, h0=True, none=("g",))
    got = run(fn, x, True)
    assert got["dg"] is None
    assert_matches_reference(SIMPLE_GLA, got, reference(SIMPLE_GLA, x, True), dtype)
    q, k, v, g = x.args()
    assert g is None
    o1, h1 = fn(q, k, v, None, initial_state=x.initial_state(), output_final_state=True)
    o2, h2 = linear(q, k, v, initial_state=x.initial_state(), output_final_state=True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)
