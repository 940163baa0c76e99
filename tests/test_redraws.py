"""The baseline drawn afresh (harness/redraws.py): every op's baseline on channel-permuted inputs,
permuted back, is the baseline to within its own rounding and not bit for bit the same."""
import pytest
import torch

from harness.cases import Case
from harness.execution import execute
from harness.goldens import baseline_function
from harness.inputs import make_inputs
from harness.redraws import baseline_redraws, channel_permutations, permuted_inputs
from harness.registry import OPS, get_op


def _case(op, **axes):
    fields = dict(op=op, dtype="fp32", B=2, T=40, H=2, K=12, V=20, h0="grad", gate="normal", seed=0,
                  M=8 if "M" in get_op(op).symbols else 0)
    return Case(**{**fields, **axes})


def _largest_difference(a: dict, b: dict) -> float:
    """max |a - b| / max |b| over the tensors both hold."""
    return max(((a[n].double() - b[n].double()).abs().max() / b[n].double().abs().max().clamp(min=1e-30)).item()
               for n in b if b[n] is not None)


@pytest.mark.parametrize("op", sorted(OPS))
def test_a_redraw_is_the_baseline_rounded_afresh(op):
    spec = get_op(op)
    case = _case(op)
    inputs = make_inputs(spec, case, "cpu")
    base = execute(baseline_function(spec, case), spec, case, inputs)
    (draw,) = baseline_redraws(spec, case, inputs, draws=1)
    assert set(draw) == set(base)
    assert all(draw[n] is None if base[n] is None else draw[n].shape == base[n].shape for n in base)
    assert _largest_difference(draw, base) < 1e-4
    assert any(base[n] is not None and not torch.equal(draw[n], base[n]) for n in base), "not drawn afresh"


def test_a_packed_case_with_an_option_is_redrawn_too():
    spec = get_op("gated_delta_rule").under("use_qk_l2norm_in_kernel")
    case = _case("gated_delta_rule", varlen="packed", option="use_qk_l2norm_in_kernel")
    inputs = make_inputs(spec, case, "cpu")
    base = execute(baseline_function(spec, case), spec, case, inputs)
    (draw,) = baseline_redraws(spec, case, inputs, draws=1)
    assert 0 < _largest_difference(draw, base) < 1e-4


def test_results_left_permuted_are_far_from_the_baseline():
    """The check above can tell: the permuted baseline's results not permuted back are off by
    their own size."""
    spec = get_op("kda")
    case = _case("kda")
    inputs = make_inputs(spec, case, "cpu")
    base = execute(baseline_function(spec, case), spec, case, inputs)
    left = execute(baseline_function(spec, case), spec, case,
                   permuted_inputs(spec, inputs, channel_permutations(inputs, 1)))
    assert _largest_difference(left, base) > 0.1
