"""Launch grids within CUDA's limits: axis 0 below 2^31, axes 1 and 2 at most 65535.

Every launch of the 12 public functions, forward and backward, is recorded and not run, at
B * H = 131072 (B = 4096, H = 32, T = 130), in a packed batch of 4097 sequences (N * H = 131104)
and on one sequence of 65537 chunks. The tensors are fake (shapes without memory), so nothing
runs at those sizes: the grids are all that is checked. A count too large for axis 0 goes on in
axis 1 (`flat_grid`): with axis 0 held to a few programs, the kernels give the same bits.
"""
import sys
from itertools import accumulate

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import fla_kernels
import fla_kernels.ops.common.launch as launching
from tests.kernel_testing import DEVICE

AXIS_0, AXES_1_2 = 2**31 - 1, 65535
FUNCTIONS = [f"{variant}_{op}" for op in ("linear_attn", "simple_gla", "gla", "rwkv6", "gsa")
             for variant in ("chunk", "fused_chunk", "fused_recurrent")
             if hasattr(fla_kernels, f"{variant}_{op}")]
# (B, T, lengths of a packed batch or None), H = 32, K = V = 128, M = 64
SHAPES = {"heads": (4096, 130, None), "sequences": (1, None, [1, 2] * 2048 + [3]),
          "chunks": (1, 65537 * 64, None)}
LARGE = dict(H=32, K=128, V=128, M=64)


def test_cuda_limits_and_the_twelve_functions():
    assert (launching.GRID_AXIS_0, launching.GRID_AXES_1_2) == (AXIS_0, AXES_1_2)
    assert len(FUNCTIONS) == 12


def _inputs(name, B, T, H, K, V, M, gen=None):
    """(the function's tensor arguments, requiring grad; its initial state for N = B)."""
    op = name.split("_", 1)[1].replace("chunk_", "").replace("recurrent_", "")

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE)

    def gate(*shape):
        return F.logsigmoid(randn(*shape)) / 4

    q, k, v = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H, V)
    tensors = {"linear_attn": (q, k, v),
               "simple_gla": (q, k, v, gate(B, T, H)),
               "gla": (q, k, v, gate(B, T, H, K)),
               "rwkv6": (q, k, v, gate(B, T, H, K), randn(H, K)),
               "gsa": (q, k, v, randn(B, T, H, M), gate(B, T, H, M))}[op]
    shapes = [(B, H, K, M), (B, H, M, V)] if op == "gsa" else [(B, H, K, V)]
    states = tuple(randn(*shape).requires_grad_() for shape in shapes)
    return [x.requires_grad_() for x in tensors], states if op == "gsa" else states[0]


def _forward_backward(name, tensors, h0, **kw):
    """(o, final states) of `name` and the backward of <o, do> + sum <final state, dht>."""
    o, final = getattr(fla_kernels, name)(*tensors, initial_state=h0, output_final_state=True, **kw)
    finals = list(final) if isinstance(final, tuple) else [final]
    gen = torch.Generator().manual_seed(1)
    upstream = [torch.randn(x.shape, generator=gen).to(x) for x in (o, *finals)]
    return o, finals, upstream


@pytest.fixture
def grids(monkeypatch):
    """The (kernel, grid) of every launch from here on; no kernel runs."""
    made = []
    original = launching.launch

    def record(kernel, grid, *args, **kwargs):
        made.append((getattr(kernel, "__name__", None) or kernel.fn.__name__, tuple(grid)))

    for module in list(sys.modules.values()):
        if module.__name__.startswith("fla_kernels.ops") and getattr(module, "launch", None) is original:
            monkeypatch.setattr(module, "launch", record)
    return made


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_grid_within_cuda_limits(name, shape, grids):
    B, T, lengths = SHAPES[shape]
    if lengths is not None and name.startswith("fused_chunk"):
        pytest.skip("fused_chunk takes no packed batches")
    if lengths is not None and DEVICE != "cpu":
        pytest.skip("a fake CUDA tensor's values cannot be read to the host (the packed call reads "
                    "its sequence starts); the grids are the same on every device, recorded on the CPU")
    kw = {}
    if lengths is not None:
        starts = list(accumulate(lengths, initial=0))
        T = starts[-1]
        kw["cu_seqlens"] = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    N = B if lengths is None else len(lengths)
    with FakeTensorMode(allow_non_fake_inputs=True):
        tensors, _ = _inputs(name, B, T, **LARGE)
        _, h0 = _inputs(name, N, 1, **LARGE)
        o, finals, upstream = _forward_backward(name, tensors, h0, **kw)
        forward = len(grids)
        torch.autograd.backward([o, *finals], upstream)
    assert forward > 0 and len(grids) > forward, f"{name}: launches recorded {forward}, {len(grids)}"
    bad = [(kernel, grid) for kernel, grid in grids
           if not (1 <= len(grid) <= 3 and 1 <= grid[0] <= AXIS_0 and all(1 <= n <= AXES_1_2 for n in grid[1:]))]
    assert not bad, f"{name} at {shape}: grids past CUDA's limits {sorted(set(bad))}"


def _results(name):
    """Every output and gradient of `name` on B = 2, T = 20, H = 3, with initial states."""
    tensors, h0 = _inputs(name, 2, 20, 3, 16, 16, 16, gen=torch.Generator().manual_seed(0))
    o, finals, upstream = _forward_backward(name, tensors, h0)
    torch.autograd.backward([o, *finals], upstream)
    states = h0 if isinstance(h0, tuple) else (h0,)
    return [x.detach() for x in (o, *finals, *(t.grad for t in tensors), *(s.grad for s in states))]


# between them every kernel of fla_kernels/ops
SPLIT = ["chunk_gla", "chunk_simple_gla", "fused_chunk_gla", "fused_chunk_linear_attn",
         "fused_recurrent_rwkv6", "chunk_gsa", "fused_recurrent_gsa"]


@pytest.mark.parametrize("name", SPLIT)
def test_grid_split_over_two_axes_gives_the_same_bits(name, monkeypatch):
    want = _results(name)
    monkeypatch.setattr(launching, "GRID_AXIS_0", 4)
    assert launching.flat_grid(2, 3, 4) == (4, 6) and launching.flat_grid(10, 1, 6) == (4, 15)
    got = _results(name)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"{name}: result {i} changed with the grid split over two axes"
