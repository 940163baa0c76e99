"""`chunk_gate_sums` (ops/common/chunk_state.py): a chunk's gate prefix, suffix and total as masked
products of the gates, in the gates' own dtype (the Triton interpreter on CPU, or the GPU, where
16-bit gates go through the tensor cores). Each sum has terms of one sign, so it must be within a
few ulps of its own size of the float64 sum, under normal and strong decay, in a chunk cut short
by T; a span one row off must be caught at that tolerance."""
import fla_kernels  # noqa: F401  (sets the interpreter up before triton is imported)
import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fla_kernels.precision import dots_in_fp32
from fla_kernels.ops.common.chunk_state import chunk_gate_sums
from tests.kernel_testing import DEVICE

BT, K = 64, 32


@triton.jit
def _sums_kernel(g, pre, suf, tot, T, K: tl.constexpr, BT: tl.constexpr,
                 PREFIX_EXCLUSIVE: tl.constexpr, FP32_DOT: tl.constexpr):
    """pre, suf [NT * BT, K], tot [NT, K] float32 of the chunk `program_id(0)` of g [T, K]."""
    i_c = tl.program_id(0)
    b_pre, b_suf, b_tot = chunk_gate_sums(g, 0, i_c * BT, T, 1, K, BT, K, 0, PREFIX_EXCLUSIVE, FP32_DOT)
    r = i_c * BT + tl.arange(0, BT)
    d = tl.arange(0, K)
    tl.store(pre + r[:, None] * K + d[None, :], b_pre)
    tl.store(suf + r[:, None] * K + d[None, :], b_suf)
    tl.store(tot + i_c * K + d, b_tot)


def _run(g: torch.Tensor, exclusive: bool):
    T = g.shape[0]
    NT = triton.cdiv(T, BT)
    pre, suf = (torch.zeros(NT * BT, K, device=DEVICE) for _ in range(2))
    tot = torch.zeros(NT, K, device=DEVICE)
    _sums_kernel[(NT,)](g.to(DEVICE), pre, suf, tot, T, K=K, BT=BT, PREFIX_EXCLUSIVE=exclusive,
                        FP32_DOT=dots_in_fp32(g.dtype))
    return pre[:T].cpu().double(), suf[:T].cpu().double(), tot.cpu().double()


def _want(g: torch.Tensor, exclusive: bool):
    """float64 (prefix, suffix [T, K], total [NT, K]) of each chunk of g."""
    gd = g.double()
    pre, suf, tot = torch.zeros_like(gd), torch.zeros_like(gd), []
    for c0 in range(0, g.shape[0], BT):
        chunk = gd[c0:c0 + BT]
        incl = chunk.cumsum(0)
        pre[c0:c0 + BT] = incl - chunk if exclusive else incl
        suf[c0:c0 + BT] = incl[-1] - incl
        tot.append(incl[-1])
    # the suffix as a difference loses the small tail sums: take it term by term instead
    for t in range(g.shape[0]):
        end = min((t // BT + 1) * BT, g.shape[0])
        suf[t] = gd[t + 1:end].sum(0)
    return pre, suf, torch.stack(tot)


def _within(got, want, eps):
    return (got - want).abs() <= 8 * eps * want.abs() + 1e-30


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("strength", [1.0, 60.0], ids=["normal", "strong"])
@pytest.mark.parametrize("exclusive", [False, True], ids=["inclusive", "exclusive"])
def test_chunk_gate_sums_match_float64(dtype, strength, exclusive):
    T = 2 * BT + 21
    gen = torch.Generator().manual_seed(int(strength) + 7 * exclusive)
    g = (F.logsigmoid(torch.randn(T, K, generator=gen)) * strength).to(dtype)
    pre, suf, tot = _run(g, exclusive)
    want_pre, want_suf, want_tot = _want(g, exclusive)
    eps = torch.finfo(torch.float32).eps
    assert _within(pre, want_pre, eps).all()
    assert _within(suf, want_suf, eps).all()
    assert _within(tot, want_tot, eps).all()
    # one row off: the other prefix form and the suffix with the row's own gate must both fail
    other_pre, _, _ = _want(g, not exclusive)
    assert not _within(pre, other_pre, eps).all()
    assert not _within(suf, want_suf + g.double(), eps).all()
