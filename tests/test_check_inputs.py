"""fla_kernels.utils.check_inputs, the one argument check of every public op: one sentence naming
the op and the argument, raised before any kernel launches, and the sizes it reads."""
import pytest
import torch

import fla_kernels
from fla_kernels.utils import check_inputs
from tests.kernel_testing import DEVICE

GLA = dict(q="BTHK", k="BTHK", v="BTHV", g="BTHK")


def _gla(B=1, T=8, H=2, K=16, V=8):
    return dict(q=torch.randn(B, T, H, K, device=DEVICE), k=torch.randn(B, T, H, K, device=DEVICE), v=torch.randn(B, T, H, V, device=DEVICE),
                g=torch.randn(B, T, H, K, device=DEVICE))


def _raises(match, *args, **kw):
    with pytest.raises(ValueError, match=match) as info:
        check_inputs(*args, **kw)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_returns_the_sizes_each_letter_takes_from_the_first_input_that_has_it():
    sizes = check_inputs("op", _gla(B=2, T=5, H=3, K=12, V=20), GLA,
                         initial_state=torch.zeros(2, 3, 12, 20, device=DEVICE))
    assert sizes == dict(B=2, T=5, H=3, K=12, V=20, N=2)


@pytest.mark.parametrize("name, bad, match", [
    ("q", torch.randn(8, 2, 16, device=DEVICE), r"^op: q must be a 4-D tensor \[B, T, H, K\], got a 3-D one\.$"),
    ("k", [0.0], r"^op: k must be a torch\.Tensor, got list\.$"),
    ("v", torch.randn(1, 5, 2, 8, device=DEVICE), r"^op: v has shape \(1, 5, 2, 8\); expected \(1, 8, 2, 8\) \[B, T, H, V\]\.$"),
    ("g", torch.randn(1, 8, 2, 16, device=DEVICE).long(), r"^op: g has dtype torch\.int64"),
    ("g", torch.randn(1, 8, 2, 16, device=DEVICE).half(), r"^op: inputs mix dtypes"),
])
def test_names_the_op_and_the_argument(name, bad, match):
    tensors = _gla()
    tensors[name] = bad
    _raises(match, "op", tensors, GLA)


def test_an_optional_input_may_be_none_but_must_fit_when_given():
    layouts = dict(q="BTHK", k="BTHK", v="BTHV", g="BTH")
    tensors = dict(_gla(), g=None)
    assert check_inputs("op", tensors, layouts, optional=("g",))["V"] == 8
    tensors["g"] = torch.randn(1, 8, 2, 16, device=DEVICE)
    _raises(r"^op: g must be a 3-D tensor \[B, T, H\] or None, got a 4-D one\.$", "op", tensors,
            layouts, optional=("g",))


def test_initial_state_one_tensor_or_a_tuple_of_named_states():
    _raises(r"^op: initial_state has shape \(1, 2, 8, 16\); expected \(1, 2, 16, 8\) \[B, H, K, V\]\.$",
            "op", _gla(), GLA, initial_state=torch.zeros(1, 2, 8, 16, device=DEVICE))
    _raises(r"^op: initial_state must be a torch\.Tensor or None\.$", "op", _gla(), GLA,
            initial_state=(torch.zeros(1, 2, 16, 8, device=DEVICE),))
    gsa = dict(q="BTHK", k="BTHK", v="BTHV", s="BTHM", g="BTHM")
    tensors = dict(q=torch.randn(1, 8, 2, 16, device=DEVICE), k=torch.randn(1, 8, 2, 16, device=DEVICE), v=torch.randn(1, 8, 2, 8, device=DEVICE),
                   s=torch.randn(1, 8, 2, 4, device=DEVICE), g=torch.randn(1, 8, 2, 4, device=DEVICE))
    states = dict(hk="BHKM", hv="BHMV")
    hk, hv = torch.zeros(1, 2, 16, 4, device=DEVICE), torch.zeros(1, 2, 4, 8, device=DEVICE)
    assert check_inputs("op", tensors, gsa, initial_state=(hk, hv), states=states)["M"] == 4
    _raises(r"^op: initial_state must be None or a pair \(hk \[B, H, K, M\], hv \[B, H, M, V\]\)\.$",
            "op", tensors, gsa, initial_state=hk, states=states)
    _raises(r"^op: initial_state hv has shape", "op", tensors, gsa,
            initial_state=(hk, hv.transpose(-1, -2)), states=states)


def test_an_empty_sequence_is_refused():
    _raises(r"^op: the sequence is empty \(T = 0\)", "op", _gla(T=0), GLA)


@pytest.mark.parametrize("name", fla_kernels.__all__)
def test_every_public_op_checks_through_it(name):
    """A 3-D first input: every op refuses it with its own name and the argument's."""
    fn = getattr(fla_kernels, name)
    first = "r" if "rwkv6" in name else "q"
    with pytest.raises(ValueError, match=rf"^{name}: {first} must be a 4-D tensor"):
        fn(torch.randn(8, 2, 16, device=DEVICE), torch.randn(1, 8, 2, 16, device=DEVICE), torch.randn(1, 8, 2, 8, device=DEVICE),
           torch.randn(1, 8, 2, 16, device=DEVICE), torch.randn(1, 8, 2, 16, device=DEVICE))
