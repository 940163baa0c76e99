"""The shared product helpers of ops/common/dot.py (the Triton interpreter on CPU, or the GPU)."""
import fla_kernels  # noqa: F401  (sets the interpreter up before triton is imported)
import pytest
import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.dot import round_tf32
from tests.kernel_testing import DEVICE


@triton.jit
def _round_kernel(x, y, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y + o, round_tf32(tl.load(x + o)))


def rounded(x: torch.Tensor) -> torch.Tensor:
    x = x.to(DEVICE)
    y = torch.empty_like(x)
    _round_kernel[(1,)](x, y, N=x.numel())
    return y.cpu()


def test_round_tf32_rounds_to_nearest_with_ties_away_from_zero():
    ulp = 2.0 ** -10  # tf32 spacing on [1, 2)
    x = torch.tensor([1 + 0.49 * ulp, 1 + 0.51 * ulp, 1 + 0.5 * ulp, -(1 + 1.5 * ulp),
                      3.0, -0.0, 1e-30, 6e4] + [0.0] * 8, dtype=torch.float32)
    want = torch.tensor([1.0, 1 + ulp, 1 + ulp, -(1 + 2 * ulp), 3.0, -0.0], dtype=torch.float32)
    got = rounded(x)
    assert torch.equal(got[:6], want)
    assert torch.equal(got[:6].signbit(), want.signbit())
    # truncation, what the tensor cores do, would give 1.0 for the second and third values
    assert got[1] != 1.0 and got[2] != 1.0


def test_round_tf32_is_within_half_a_tf32_ulp_and_keeps_10_bits():
    x = torch.randn(1024, generator=torch.Generator().manual_seed(0)) * 1e3
    got = rounded(x)
    assert ((got - x).abs() <= x.abs() * 2.0 ** -11).all()
    assert (got.view(torch.int32) & 0x1FFF).eq(0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_round_tf32_leaves_half_precision_values_unchanged(dtype):
    x = (torch.randn(1024, generator=torch.Generator().manual_seed(1)) * 100).to(dtype).float()
    assert torch.equal(rounded(x), x)
