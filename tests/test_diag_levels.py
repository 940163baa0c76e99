"""`diag_level_sums`, the factored pair products of a gate block's diagonal (the Triton interpreter
on CPU, or the GPU): every pair below the diagonal in exactly one level, factors whose product is
exp(pre_i - pre+_j) to a few ulps of the pair's own exponent, for a block at the start of its
tile and one further down, and nothing above 1 or non-finite under the strongest decay."""
import fla_kernels  # noqa: F401  (sets the interpreter up before triton is imported)
import pytest
import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.chunk_gated import BC, LEVELS
from fla_kernels.ops.common.chunk_state import diag_level_sums
from tests.kernel_testing import DEVICE

K = 16
OFF = 32  # the block's rows in the second tile layout: rows OFF.. of a [BR, K] tile
BR = 64


@triton.jit
def _levels_kernel(g, E, count, T, K: tl.constexpr, BC: tl.constexpr, LEVELS: tl.constexpr,
                   EXCLUSIVE: tl.constexpr, OFF: tl.constexpr, BR: tl.constexpr):
    """E [BC, BC, K]: the sum over levels of f_row[i] * f_col[j] on each level's pairs;
    count [BC, BC]: how many levels hold each pair. The block's T rows of g sit at rows OFF.. of
    a [BR, K] tile whose other rows hold a gate of -1000 (which no pair may pick up)."""
    o = tl.arange(0, BC)
    r = tl.arange(0, BR)
    d = tl.arange(0, K)
    inside = (r >= OFF) & (r < OFF + T)
    b_g = tl.load(g + (r - OFF)[:, None] * K + d[None, :], mask=inside[:, None], other=0)
    b_g = tl.where(inside[:, None], b_g, -1000.0)
    b_E = tl.zeros([BC, BC, K], dtype=tl.float32)
    b_n = tl.zeros([BC, BC], dtype=tl.int32)
    for lvl in tl.static_range(LEVELS):
        f_row, f_col, pairs = diag_level_sums(b_g, OFF, BR, BC, 1 << lvl, EXCLUSIVE, True, tl.float32)
        b_E += tl.where(pairs[:, :, None], f_row[:, None, :] * f_col[None, :, :], 0.0)
        b_n += pairs.to(tl.int32)
    tl.store(E + (o[:, None, None] * BC + o[None, :, None]) * K + d[None, None, :], b_E)
    tl.store(count + o[:, None] * BC + o[None, :], b_n)


def levels(g: torch.Tensor, exclusive: bool, off: int = 0):
    """(E, count) of `_levels_kernel` for the gate g [T, K] (T <= BC) at row `off` of its tile."""
    T = g.shape[0]
    g = g.contiguous().to(DEVICE)
    E = torch.empty(BC, BC, K, device=DEVICE)
    count = torch.empty(BC, BC, dtype=torch.int32, device=DEVICE)
    _levels_kernel[(1,)](g, E, count, T, K=K, BC=BC, LEVELS=LEVELS, EXCLUSIVE=exclusive, OFF=off,
                         BR=BC if off == 0 else BR)
    return E.cpu(), count.cpu()


def expected(g: torch.Tensor, exclusive: bool, dtype=torch.float64) -> torch.Tensor:
    """exp(pre_i - pre+_j) for j < i from prefix sums in `dtype` (float64: the truth), zero
    elsewhere."""
    pre_incl = g.to(dtype).cumsum(0)
    pre_row = pre_incl - g.to(dtype) if exclusive else pre_incl
    want = torch.zeros(BC, BC, K, dtype=dtype)
    for i in range(g.shape[0]):
        for j in range(i):
            want[i, j] = (pre_row[i] - pre_incl[j]).exp()
    return want


@pytest.mark.parametrize("off", [0, OFF], ids=["own-tile", "inside-a-chunk-tile"])
@pytest.mark.parametrize("exclusive", [False, True], ids=["gla", "rwkv6"])
def test_every_pair_below_the_diagonal_is_in_exactly_one_level(exclusive, off):
    _, count = levels(-torch.rand(BC, K), exclusive, off)
    assert torch.equal(count, torch.ones(BC, BC, dtype=torch.int32).tril(-1))


def _pair_error(E, want):
    """max over the pairs with a normal decay of |E - want| / (eps * (1 + |log want|) * want):
    the error in ulps of the pair's own exponent."""
    normal = want > 1e-30
    eps = torch.finfo(torch.float32).eps
    return ((E.double() - want).abs() / (eps * (1 - want.log()) * want))[normal].max().item()


@pytest.mark.parametrize("off", [0, OFF], ids=["own-tile", "inside-a-chunk-tile"])
@pytest.mark.parametrize("exclusive", [False, True], ids=["gla", "rwkv6"])
def test_gate_sums_are_exact_to_the_pairs_own_exponent(exclusive, off):
    """Under strong decay a pair of neighbours late in the block decays by exp(-g) of one step,
    but pre_i - pre+_j is a difference of prefixes near -250: that carries eps * 250, the sums of
    the gates a few ulps of the pair's own exponent. Checked both ways."""
    g = -torch.rand(BC, K, generator=torch.Generator().manual_seed(3)) * 30
    want = expected(g, exclusive)
    sums, _ = levels(g, exclusive, off)
    assert torch.isfinite(sums).all() and (sums <= 1).all() and (sums >= 0).all()
    assert _pair_error(sums, want) <= 8
    # the same decays from float32 prefix differences, what summing the gates avoids: the bound
    # above must be able to fail
    assert _pair_error(expected(g, exclusive, torch.float32), want) > 8


@pytest.mark.parametrize("exclusive", [False, True], ids=["gla", "rwkv6"])
@pytest.mark.parametrize("scale", [1.0, 60.0], ids=["normal", "decay-60-per-step"])
def test_factors_multiply_to_the_pair_decay(exclusive, scale):
    """At 60 per step the pair decays span exp(-570): each factor stays <= 1, their product is the
    decay where it is a normal number, and nothing is inf or NaN."""
    g = -torch.rand(BC, K, generator=torch.Generator().manual_seed(1)) * scale
    E, _ = levels(g, exclusive)
    want = expected(g, exclusive)
    assert torch.isfinite(E).all() and (E <= 1).all() and (E >= 0).all()
    normal = want > 1e-30
    assert _pair_error(E, want) <= 8
    assert (E.double()[~normal] <= 1e-30).all()


def test_a_block_cut_short_by_T_keeps_its_rows_exact():
    """T = 5 ends the block mid-way: the zero gates past T are never used by the rows before it."""
    T = 5
    g = -torch.rand(T, K, generator=torch.Generator().manual_seed(2))
    E, _ = levels(g, exclusive=False)
    want = expected(g, exclusive=False)
    assert torch.isfinite(E).all()
    assert torch.allclose(E[:T, :T].double(), want[:T, :T], rtol=1e-5, atol=0)
