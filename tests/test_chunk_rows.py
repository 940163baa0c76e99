"""The chunk-wide gate exponents of ops/common/chunk_state.py, as gated slot attention takes them
(the Triton interpreter on CPU, or the GPU, where 16-bit gates go through the tensor cores):
`gates_after` the sum of the gates after each row of the chunk up to the start of a later
sub-chunk, `gates_from` the sum of the gates from the end of a sub-chunk through each later row,
both over a chunk tile that holds only the rows the span needs (`load_chunk_rows`), against
float64 sums, in a full chunk and in one cut short by T."""
import fla_kernels  # noqa: F401  (sets the interpreter up before triton is imported)
import pytest
import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.chunk_state import gates_after, gates_from
from fla_kernels.precision import dots_in_fp32
from fla_kernels.ops.common.tiles import load_chunk_rows
from tests.kernel_testing import DEVICE

BT, BC, K = 64, 16, 16
NC = BT // BC


@triton.jit
def _rows_kernel(g, to_rows, from_rows, T, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                 FP32_DOT: tl.constexpr):
    """For the chunk i_c and sub-chunk i_s of this program, [BT, K] each: the gates after each
    row up to the start of I = i_s (from the rows before I), and from the end of J = i_s through
    each row (from the rows after J). One head, one sequence."""
    NC: tl.constexpr = BT // BC
    GATE_DTYPE: tl.constexpr = g.dtype.element_ty
    i_c, i_s = tl.program_id(0), tl.program_id(1)
    c0 = i_c * BT
    o = tl.arange(0, BT)
    d = tl.arange(0, K)
    offs = ((i_c * NC + i_s) * BT + o)[:, None] * K + d[None, :]
    b_before = load_chunk_rows(g, 0, c0, 0, i_s * BC, T, 1, K, BT, K, 0)
    tl.store(to_rows + offs, gates_after(b_before, 0, i_s * BC, BT, BT, FP32_DOT, GATE_DTYPE))
    b_after = load_chunk_rows(g, 0, c0, (i_s + 1) * BC, BT, T, 1, K, BT, K, 0)
    tl.store(from_rows + offs, gates_from(b_after, (i_s + 1) * BC, 0, BT, BT, False, FP32_DOT,
                                          GATE_DTYPE))


def _run(g: torch.Tensor):
    """(to_rows, from_rows) [NT, NC, BT, K] of `_rows_kernel` for g [T, K]."""
    T = g.shape[0]
    NT = triton.cdiv(T, BT)
    out = [torch.zeros(NT, NC, BT, K, device=DEVICE) for _ in range(2)]
    _rows_kernel[(NT, NC)](g.contiguous().to(DEVICE), *out, T, K=K, BT=BT, BC=BC,
                           FP32_DOT=dots_in_fp32(g.dtype))
    return tuple(x.cpu() for x in out)


def _gates(T: int, dtype: torch.dtype) -> torch.Tensor:
    return (-torch.rand(T, K, generator=torch.Generator().manual_seed(T)) * 30.0).to(dtype)


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


def _within(got, want):
    """Every term has one sign, so the float32 sum is within a few ulps of its own size."""
    return (got - want).abs() <= 8 * torch.finfo(torch.float32).eps * want.abs() + 1e-30


DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
LENGTHS = pytest.mark.parametrize("T", [BT, BT + 37], ids=["whole-chunk", "cut-short"])


def _check_every_span(got, want_of, one_off_of, sub_chunks):
    """got [NT, NC, BT, K] against want_of(i_c, i_s) (nan where undefined) within `_within`, and
    one_off_of(want, i_c, i_s), the span one row off, outside it on every defined row."""
    checked = 0
    for i_c in range(got.shape[0]):
        for i_s in sub_chunks:
            want = want_of(i_c, i_s)
            rows = ~want.isnan()
            if not rows.any():
                continue
            assert _within(got[i_c, i_s].double(), want)[rows].all()
            assert not _within(one_off_of(want, i_c, i_s), want)[rows].any()
            checked += int(rows.sum())
    assert checked > 0


@DTYPES
@LENGTHS
def test_gates_after_sums_the_gates_up_to_the_sub_chunk(T, dtype):
    """Counting each row's own gate in (one row off) must be caught at the tolerance."""
    g = _gates(T, dtype)

    def with_own_gate(want, i_c, i_s):
        own = torch.zeros(BT, K, dtype=torch.float64)
        n = min(BT, g.shape[0] - i_c * BT)
        own[:n] = g[i_c * BT:i_c * BT + n].double()
        return want + own

    _check_every_span(_run(g)[0], lambda i_c, i_s: _suffix_to(g, i_c, i_s), with_own_gate,
                      range(1, NC))


@DTYPES
@LENGTHS
def test_gates_from_sums_the_gates_after_the_sub_chunk(T, dtype):
    """Counting the last row of J in (one row off) must be caught at the tolerance."""
    g = _gates(T, dtype)

    def with_last_of_j(want, i_c, i_s):
        return want + g[i_c * BT + (i_s + 1) * BC - 1].double()

    _check_every_span(_run(g)[1], lambda i_c, i_s: _prefix_from(g, i_c, i_s), with_last_of_j,
                      range(NC - 1))
