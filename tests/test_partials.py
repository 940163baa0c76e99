"""`sum_parts` (ops/common/partials.py) against torch's sum over the leading axis and cast, to the
bit (the Triton interpreter on CPU, or the GPU), for one to four partials and sizes that do not
fill the last block."""
import fla_kernels  # noqa: F401  (sets the interpreter up before triton is imported)
import pytest
import torch

from fla_kernels.ops.common.partials import BLOCK, sum_parts
from tests.kernel_testing import DEVICE


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_sum_parts_is_torchs_sum_and_cast_to_the_bit(n, dtype):
    gen = torch.Generator().manual_seed(n)
    parts = torch.randn(n, 3, BLOCK + 5, 7, generator=gen).to(DEVICE)
    got = sum_parts(parts, dtype)
    want = parts.sum(0).to(dtype)
    assert got.dtype == dtype and got.shape == want.shape
    assert torch.equal(got, want)
    if n > 1:
        assert not torch.equal(got, parts[:-1].sum(0).to(dtype)), "every part must count"


@pytest.mark.skipif(DEVICE != "cuda", reason="needs 13 GB of GPU memory: partials past 2^31 elements")
def test_sum_parts_reaches_partials_past_two_to_the_31_elements():
    n = 2 ** 30 + BLOCK + 3  # three parts of n elements: the third starts past 2^31
    parts = torch.empty(3, n, device=DEVICE)
    for i in range(3):
        parts[i].fill_(float(4 ** i))
    out = sum_parts(parts, torch.float32)
    assert bool((out == 21.0).all()), "a part past 2^31 elements was read from the wrong place"
