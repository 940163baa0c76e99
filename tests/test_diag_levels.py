"""`diag_level`, the factored pair products of a gate block's diagonal (the Triton interpreter on
CPU, or the GPU): every pair below the diagonal in exactly one level, factors whose product is
exp(pre_i - pre+_j), and nothing above 1 or non-finite under the strongest decay."""
import fla_kernels  # noqa: F401  (sets the interpreter up before triton is imported)
import pytest
import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.chunk_gated import BC, LEVELS
from fla_kernels.ops.common.chunk_state import (block_gate_sums, diag_level, diag_level_sums,
                                                load_prefix)
from tests.kernel_testing import DEVICE

K = 16


@triton.jit
def _levels_kernel(P, g, E, count, T, K: tl.constexpr, BC: tl.constexpr, LEVELS: tl.constexpr,
                   EXCLUSIVE: tl.constexpr, SUMS: tl.constexpr):
    """E [BC, BC, K]: the sum over levels of f_row[i] * f_col[j] on each level's pairs;
    count [BC, BC]: how many levels hold each pair. One gate block at t0 = 0, B = H = 1.
    SUMS: `diag_level_sums` from the gates g instead of `diag_level` from the prefix sums P."""
    o = tl.arange(0, BC)
    d = tl.arange(0, K)
    b_pre = load_prefix(P, 0, 0, T, 1, K, BC, K, 0, BC, EXCLUSIVE)
    b_prej = load_prefix(P, 0, 0, T, 1, K, BC, K, 0, BC, False)
    b_g = tl.load(g + o[:, None] * K + d[None, :], mask=(o < T)[:, None], other=0)
    b_E = tl.zeros([BC, BC, K], dtype=tl.float32)
    b_n = tl.zeros([BC, BC], dtype=tl.int32)
    for lvl in tl.static_range(LEVELS):
        if SUMS:
            f_row, f_col, pairs = diag_level_sums(b_g, BC, 1 << lvl, True, tl.float32)
        else:
            f_row, f_col, pairs = diag_level(P, 0, 0, T, 1, K, BC, K, 0, b_pre, b_prej, 1 << lvl)
        b_E += tl.where(pairs[:, :, None], f_row[:, None, :] * f_col[None, :, :], 0.0)
        b_n += pairs.to(tl.int32)
    tl.store(E + (o[:, None, None] * BC + o[None, :, None]) * K + d[None, None, :], b_E)
    tl.store(count + o[:, None] * BC + o[None, :], b_n)


def levels(g: torch.Tensor, exclusive: bool, sums: bool = False):
    """(E, count) of `_levels_kernel` for the gate g [T, K] (T <= BC)."""
    T = g.shape[0]
    g = g.contiguous().to(DEVICE)
    P, _ = block_gate_sums(g.reshape(1, T, 1, K), BC)
    E = torch.empty(BC, BC, K, device=DEVICE)
    count = torch.empty(BC, BC, dtype=torch.int32, device=DEVICE)
    _levels_kernel[(1,)](P, g, E, count, T, K=K, BC=BC, LEVELS=LEVELS, EXCLUSIVE=exclusive, SUMS=sums)
    return E.cpu(), count.cpu()


def expected(g: torch.Tensor, exclusive: bool) -> torch.Tensor:
    """exp(pre_i - pre+_j) for j < i (float64), zero elsewhere."""
    pre_incl = g.double().cumsum(0)
    pre_row = pre_incl - g.double() if exclusive else pre_incl
    T = g.shape[0]
    want = torch.zeros(BC, BC, K, dtype=torch.float64)
    for i in range(T):
        for j in range(i):
            want[i, j] = (pre_row[i] - pre_incl[j]).exp()
    return want


@pytest.mark.parametrize("sums", [False, True], ids=["prefix-differences", "gate-sums"])
def test_every_pair_below_the_diagonal_is_in_exactly_one_level(sums):
    _, count = levels(-torch.rand(BC, K), exclusive=False, sums=sums)
    assert torch.equal(count, torch.ones(BC, BC, dtype=torch.int32).tril(-1))


def _pair_error(E, want):
    """max over the pairs with a normal decay of |E - want| / (eps * (1 + |log want|) * want):
    the error in ulps of the pair's own exponent."""
    normal = want > 1e-30
    eps = torch.finfo(torch.float32).eps
    return ((E.double() - want).abs() / (eps * (1 - want.log()) * want))[normal].max().item()


def test_gate_sums_are_exact_to_the_pairs_own_exponent():
    """Under strong decay a pair of neighbours late in the block decays by exp(-g) of one step,
    but pre_i - r is a difference of prefixes near -250: `diag_level` carries eps * 250 there,
    `diag_level_sums` a few ulps of the pair's own exponent. Checked both ways."""
    g = -torch.rand(BC, K, generator=torch.Generator().manual_seed(3)) * 30
    want = expected(g, exclusive=False)
    sums, _ = levels(g, exclusive=False, sums=True)
    diffs, _ = levels(g, exclusive=False, sums=False)
    assert torch.isfinite(sums).all() and (sums <= 1).all() and (sums >= 0).all()
    assert _pair_error(sums, want) <= 8
    assert _pair_error(diffs, want) > 8


@pytest.mark.parametrize("exclusive", [False, True], ids=["gla", "rwkv6"])
@pytest.mark.parametrize("scale", [1.0, 60.0], ids=["normal", "decay-60-per-step"])
def test_factors_multiply_to_the_pair_decay(exclusive, scale):
    """At 60 per step the pair decays span exp(-570): each factor stays <= 1, their product is the
    decay where it is a normal number, and nothing is inf or NaN. The exponents are differences of
    float32 prefix sums, so the product is as exact as those: a few ulps of the largest prefix."""
    g = -torch.rand(BC, K, generator=torch.Generator().manual_seed(1)) * scale
    E, _ = levels(g, exclusive)
    want = expected(g, exclusive)
    assert torch.isfinite(E).all() and (E <= 1).all() and (E >= 0).all()
    eps = torch.finfo(torch.float32).eps
    rtol = 4 * eps * (1 + g.sum(0).abs().max().item())
    normal = want > 1e-30
    assert torch.allclose(E.double()[normal], want[normal], rtol=rtol, atol=0)
    assert (E.double()[~normal] <= 1e-30).all()


def test_a_block_cut_short_by_T_keeps_its_rows_exact():
    """T = 5 ends the block mid-way: the references past T are never used by the rows before it."""
    T = 5
    g = -torch.rand(T, K, generator=torch.Generator().manual_seed(2))
    E, _ = levels(g, exclusive=False)
    want = expected(g, exclusive=False)
    assert torch.isfinite(E).all()
    assert torch.allclose(E[:T, :T].double(), want[:T, :T], rtol=1e-5, atol=0)
