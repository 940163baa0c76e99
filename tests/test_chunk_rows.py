"""The chunk-wide gate exponents of ops/common/chunk_state.py (the Triton interpreter on CPU, or the
GPU): `suffix_to_rows` the sum of the gates after each row up to the start of a later sub-chunk,
`prefix_from_rows` the sum of the gates from the end of a sub-chunk through each later row, against
float64 sums, in a full chunk and in one cut short by T."""
import fla_kernels  # noqa: F401  (sets the interpreter up before triton is imported)
import pytest
import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.chunk_state import block_gate_sums, prefix_from_rows, suffix_to_rows
from tests.kernel_testing import DEVICE

BT, BC, K = 64, 16, 16
NC = BT // BC


@triton.jit
def _rows_kernel(P, Q, to_rows, from_rows, T, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """For the chunk i_c and sub-chunk i_s of this program, [BT, K] each: suffix_to_rows against
    I = i_s, prefix_from_rows from J = i_s. One head, one sequence."""
    NC: tl.constexpr = BT // BC
    i_c, i_s = tl.program_id(0), tl.program_id(1)
    c0 = i_c * BT
    o = tl.arange(0, BT)
    d = tl.arange(0, K)
    offs = ((i_c * NC + i_s) * BT + o)[:, None] * K + d[None, :]
    tl.store(to_rows + offs, suffix_to_rows(P, Q, 0, c0, T, 1, K, BT, BC, K, 0, i_s))
    tl.store(from_rows + offs, prefix_from_rows(P, 0, c0, T, 1, K, BT, BC, K, 0, i_s))


def _run(g: torch.Tensor):
    """(to_rows, from_rows) [NT, NC, BT, K] of `_rows_kernel` for g [T, K]."""
    T = g.shape[0]
    NT = triton.cdiv(T, BT)
    P, Q = block_gate_sums(g.reshape(1, T, 1, K).contiguous().to(DEVICE), BC)
    out = [torch.zeros(NT, NC, BT, K, device=DEVICE) for _ in range(2)]
    _rows_kernel[(NT, NC)](P, Q, *out, T, K=K, BT=BT, BC=BC)
    return tuple(x.cpu() for x in out)


def _gates(T: int, strength: float) -> torch.Tensor:
    return -torch.rand(T, K, generator=torch.Generator().manual_seed(T)) * strength


def _suffix_to(g: torch.Tensor, i_c: int, i_i: int) -> torch.Tensor:
    """[BT, K] float64 sum of g after each row of a sub-chunk before I = i_i of chunk i_c up to the
    start of I (rows past T and of I or later: nan)."""
    want = torch.full((BT, K), float("nan"), dtype=torch.float64)
    end = i_c * BT + i_i * BC
    for r in range(i_i * BC):
        t = i_c * BT + r
        if t < g.shape[0]:
            want[r] = g[t + 1:end].double().sum(0)
    return want


@pytest.mark.parametrize("T", [BT, BT + 37], ids=["whole-chunk", "cut-short"])
def test_suffix_to_rows_sums_the_gates_up_to_the_sub_chunk(T):
    """Every term has one sign, so the float32 sum is within a few ulps of its own size; counting
    each row's own gate in (one row off) must be caught at that tolerance."""
    g = _gates(T, 30.0)
    to_rows, _ = _run(g)
    eps = torch.finfo(torch.float32).eps
    checked = 0
    for i_c in range(to_rows.shape[0]):
        for i_i in range(1, NC):
            want = _suffix_to(g, i_c, i_i)
            rows = ~want.isnan()
            if not rows.any():
                continue
            got = to_rows[i_c, i_i].double()
            tol = 8 * eps * want.abs() + 1e-30
            assert ((got - want).abs() <= tol)[rows].all()
            own = torch.zeros(BT, K, dtype=torch.float64)
            n = min(BT, g.shape[0] - i_c * BT)
            own[:n] = g[i_c * BT:i_c * BT + n].double()
            assert not ((want + own - want).abs() <= tol)[rows].any()
            checked += int(rows.sum())
    assert checked > 0


def _prefix_from(g: torch.Tensor, i_c: int, i_j: int) -> torch.Tensor:
    """[BT, K] float64 sum of g from the row after sub-chunk J = i_j of chunk i_c through each row
    of a later sub-chunk (rows past T and of J or earlier: nan)."""
    want = torch.full((BT, K), float("nan"), dtype=torch.float64)
    start = i_c * BT + (i_j + 1) * BC
    for r in range((i_j + 1) * BC, BT):
        t = i_c * BT + r
        if t < g.shape[0]:
            want[r] = g[start:t + 1].double().sum(0)
    return want


@pytest.mark.parametrize("T", [BT, BT + 37], ids=["whole-chunk", "cut-short"])
def test_prefix_from_rows_sums_the_gates_after_the_sub_chunk(T):
    """Every term has one sign, so the float32 sum is within a few ulps of its own size; counting
    the last row of J in (one row off) must be caught at that tolerance."""
    g = _gates(T, 30.0)
    _, from_rows = _run(g)
    eps = torch.finfo(torch.float32).eps
    checked = 0
    for i_c in range(from_rows.shape[0]):
        for i_j in range(NC - 1):
            want = _prefix_from(g, i_c, i_j)
            rows = ~want.isnan()
            if not rows.any():
                continue
            got = from_rows[i_c, i_j].double()
            assert ((got - want).abs() <= 8 * eps * want.abs())[rows].all()
            one_off = want + g[i_c * BT + (i_j + 1) * BC - 1].double()
            assert not ((one_off - want).abs() <= 8 * eps * want.abs())[rows].any()
            checked += int(rows.sum())
    assert checked > 0
