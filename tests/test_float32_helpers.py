"""A release's layer helpers in float32 inside a float64 layer (harness/float32_helpers.py): the
layer's float64 tensors go in as float32 and the results come back as float64, also where a
helper's own autograd backward calls its other helpers with float32 tensors (fla 0.6.0's
`rms_norm_linear`, whose backward calls `layer_norm_bwd`: GatedSlotAttention's golden)."""
import sys
import textwrap

import pytest
import torch

from harness.float32_helpers import helpers_in_float32

HELPERS = {
    "helperpkg/__init__.py": "",
    "helperpkg/modules.py": """
        import torch


        def _refuse_float64(*tensors):
            # as fla's Triton helpers, which do not compile for float64
            assert all(t.dtype != torch.float64 for t in tensors), "float64 reached a float32 kernel"


        def scale_fwd(x, w):
            _refuse_float64(x, w)
            return x * w, x.clone()


        def scale_bwd(dy, x, w):
            _refuse_float64(dy, x, w)
            return dy * w, (dy * x).sum(0), x


        class ScaleFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w):
                y, saved = scale_fwd(x, w)
                ctx.save_for_backward(saved, w)
                return y

            @staticmethod
            def backward(ctx, dy):
                x, w = ctx.saved_tensors
                dx, dw, recomputed = scale_bwd(dy, x, w)
                assert recomputed.dtype == dy.dtype, "a backward's helper changed the dtype"
                return dx, dw


        def scale(x, w):
            return ScaleFunction.apply(x, w)
    """,
}


@pytest.fixture()
def helperpkg(tmp_path, monkeypatch):
    for path, source in HELPERS.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    import helperpkg.modules
    yield helperpkg.modules
    for name in [n for n in sys.modules if n == "helperpkg" or n.startswith("helperpkg.")]:
        del sys.modules[name]


def test_a_helper_and_its_backward_run_in_float32_for_a_float64_layer(helperpkg):
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(4, 3, dtype=torch.float64)
    with helpers_in_float32("helperpkg"):
        y = helperpkg.scale(x, w)
        (y * dy).sum().backward()
    assert y.dtype == x.grad.dtype == w.grad.dtype == torch.float64
    torch.testing.assert_close(y, x.detach() * w.detach(), rtol=1e-6, atol=0)
    torch.testing.assert_close(x.grad, dy * w.detach(), rtol=1e-6, atol=0)
    torch.testing.assert_close(w.grad, (dy * x.detach()).sum(0), rtol=1e-6, atol=1e-7)


def test_without_the_helpers_in_float32_a_float64_layer_reaches_the_float32_kernel(helperpkg):
    x, w = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    with pytest.raises(AssertionError, match="float64 reached a float32 kernel"):
        helperpkg.scale(x, w)
