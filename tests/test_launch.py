"""`launch` and `compiles_ahead` (ops/common/launch.py): a first call's dry run only compiles (no
kernel runs, its outputs are dropped), the caller always gets the real run, each configuration
has one dry run per process, and a dry run that fails changes nothing. On the CPU the interpreter
has nothing to compile, so the tests switch the dry run on by hand; on a GPU the last test runs
a real op through it and checks that the first call equals a later one bit for bit."""
import fla_kernels  # noqa: F401  (sets the interpreter up before triton is imported)
import pytest
import torch
import triton
import triton.language as tl

import fla_kernels.ops.common.launch as launching
from fla_kernels.ops.common.launch import compiles_ahead, launch
from fla_kernels.utils import interpreting
from tests.kernel_testing import DEVICE


@triton.jit
def _fill_kernel(x, value, N: tl.constexpr):
    tl.store(x + tl.arange(0, N), value)


@pytest.fixture
def dry_runs(monkeypatch):
    """Dry runs switched on (as on a GPU), a fresh record of seen configurations, and the list of
    the dry runs made."""
    monkeypatch.setattr(launching, "compile_ahead_available", lambda: True)
    monkeypatch.setattr(launching, "_SEEN", set())
    made = []
    real = launching._dry_run

    def counted(fn, args, kwargs):
        made.append(args)
        real(fn, args, kwargs)

    monkeypatch.setattr(launching, "_dry_run", counted)
    return made


def _filled(value, dtype=torch.float32, calls=None):
    x = torch.zeros(16, dtype=dtype, device=DEVICE)
    launch(_fill_kernel, (1,), x, value, N=16)
    if calls is not None:
        calls.append(x)
    return x


@pytest.mark.skipif(not interpreting(), reason="on a GPU a compile-only launch compiles for real")
def test_a_compile_only_launch_runs_nothing():
    token = launching._COMPILE_ONLY.set(True)
    try:
        x = _filled(3.0)
    finally:
        launching._COMPILE_ONLY.reset(token)
    assert (x == 0).all()
    assert (_filled(3.0) == 3).all()


@pytest.mark.skipif(not interpreting(), reason="switches the dry run on by hand under the interpreter")
def test_the_first_call_of_a_configuration_runs_dry_once_and_returns_the_real_run(dry_runs):
    calls = []

    @compiles_ahead
    def filled_like(x, value):
        return _filled(value, x.dtype, calls)

    assert (filled_like(torch.ones(3, 4), 2.0) == 2).all()
    assert len(dry_runs) == 1 and len(calls) == 2
    assert (calls[0] == 0).all()  # the dry run's output: nothing was launched into it
    assert (filled_like(torch.ones(7, 4), 5.0) == 5).all()  # another length and value: the same
    assert len(dry_runs) == 1 and len(calls) == 3
    filled_like(torch.ones(3, 4, dtype=torch.float64), 5.0)  # another dtype: another configuration
    assert len(dry_runs) == 2


@pytest.mark.skipif(not interpreting(), reason="switches the dry run on by hand under the interpreter")
def test_a_failing_dry_run_changes_nothing(dry_runs):
    runs = []

    @compiles_ahead
    def flaky(x):
        runs.append(launching._COMPILE_ONLY.get())
        if launching._COMPILE_ONLY.get():
            raise RuntimeError("only in the dry run")
        return _filled(x)

    assert (flaky(4.0) == 4).all()
    assert runs == [True, False]

    @compiles_ahead
    def broken(x):
        raise ValueError("in every run")

    with pytest.raises(ValueError, match="in every run"):
        broken(1.0)


class _Double(torch.autograd.Function):
    @staticmethod
    @compiles_ahead
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _filled(2.0, x.dtype) * x

    @staticmethod
    @compiles_ahead
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return _filled(2.0, x.dtype) * dy


@pytest.mark.skipif(not interpreting(), reason="switches the dry run on by hand under the interpreter")
def test_an_autograd_function_is_keyed_by_its_gradients_needed(dry_runs):
    x = torch.ones(16, device=DEVICE, requires_grad=True)
    y = _Double.apply(x)
    y.backward(torch.full_like(y, 3.0))
    assert (y == 2).all() and (x.grad == 6).all()
    assert len(dry_runs) == 2  # the forward's and the backward's
    _Double.apply(x.detach())  # no gradient needed: another forward configuration
    assert len(dry_runs) == 3
    _Double.apply(x).backward(torch.ones(16, device=DEVICE))
    assert len(dry_runs) == 3


@pytest.mark.skipif(interpreting(), reason="needs a GPU: compiles through AsyncCompileMode")
def test_a_first_call_on_the_gpu_equals_a_later_one(monkeypatch):
    from fla_kernels import chunk_gla
    monkeypatch.setattr(launching, "_SEEN", set())
    made = []
    real = launching._dry_run
    monkeypatch.setattr(launching, "_dry_run", lambda fn, a, k: (made.append(fn), real(fn, a, k)))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 80, 2, 48, generator=gen).to(DEVICE, torch.float16) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(1, 80, 2, 48, generator=gen)).to(DEVICE, torch.float16)

    def grads():
        xs = [x.clone().requires_grad_() for x in (q, k, v, g)]
        chunk_gla(*xs)[0].float().square().sum().backward()
        return [x.grad for x in xs]

    first = grads()
    assert len(made) == 2  # the forward's and the backward's dry runs
    for a, b in zip(first, grads()):
        assert torch.equal(a, b)
