"""Kernel launches: the sizes one call's launches share, their grids (`flat_grid`), and first calls
that compile all their kernels at once.

Triton compiles a kernel when it is first launched, one kernel after another: a chunked backward
of six to eight kernels spent 12-17 s compiling on the H100 host before its first result. A pass
decorated with `compiles_ahead` runs, the first time it meets a configuration, once as a dry run in
which every `launch` only hands its kernel to a pool of compiler threads (triton's AsyncCompileMode;
the compiler releases the GIL for most of its work) and waits for them all; then it runs for real
from the compiled kernels. The dry run never launches a kernel, and its outputs (uninitialised
memory) are dropped: what the caller gets is always the real run. Anything the dry run raises is
dropped too; the real run then compiles as before and raises what it raises.

Not under the interpreter (nothing to compile), nor inside an AsyncCompileMode someone else opened.
"""
from __future__ import annotations

import contextvars
import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
from torch.autograd.function import FunctionCtx

from fla_kernels.precision import product_settings
from fla_kernels.utils import interpreting

try:
    from triton.runtime._async_compile import AsyncCompileMode, active_mode
except ImportError:  # a triton without it compiles at each launch, as before
    AsyncCompileMode = active_mode = None



def block_size(n: int, cap: int = 64) -> int:
    """A power-of-two block covering n (at least 16, the smallest `tl.dot` size), at most cap."""
    return min(cap, max(16, triton.next_power_of_2(n)))


def tuned_blocks(K: int, V: int, tuning: dict | None) -> tuple[int, int, dict]:
    """(BK, BV, launch keywords) of a kernel from its tuning entry: the block caps "BK" and "BV"
    (64 when absent) and, where given, "num_warps" and "num_stages"."""
    t = tuning or {}
    options = {name: t[name] for name in ("num_warps", "num_stages") if name in t}
    return block_size(K, cap=t.get("BK", 64)), block_size(V, cap=t.get("BV", 64)), options


class LaunchSizes:
    """The sizes and product settings that the launches of one call of a chunked op share.

    B, T, H, K from q [B, T, H, K] and V from v [B, T, H, V]; NT, the chunks of `chunk_size`
    tokens; BK, BV, the default column blocks (`block_size`), and NK, NV, how many of them cover
    K and V; dots, the `mma` constexprs of the inputs' dtype (`product_settings`, with tf32
    operands where `tf32`). One class, so no op recomputes them its own way; an op's own
    settings (tuned blocks, workarounds) are attributes of a subclass next to its kernels.
    """

    def __init__(self, q: torch.Tensor, v: torch.Tensor, chunk_size: int, tf32: bool = False):
        self.B, self.T, self.H, self.K = q.shape
        self.V = v.shape[-1]
        self.NT = triton.cdiv(self.T, chunk_size)
        self.BK, self.BV = block_size(self.K), block_size(self.V)
        self.NK, self.NV = triton.cdiv(self.K, self.BK), triton.cdiv(self.V, self.BV)
        self.dots = product_settings(q.dtype, tf32=tf32)

    @property
    def state_dots(self) -> dict:
        """`dots` as the keywords `chunk_fwd_h` and `chunk_bwd_dh` take them."""
        return dict(fp32_dot=self.dots["FP32_DOT"], operand_dtype=self.dots["OPERAND_DTYPE"])


# CUDA's grid limits: up to 2^31 - 1 programs along axis 0, 65535 along axes 1 and 2
GRID_AXIS_0, GRID_AXES_1_2 = 2**31 - 1, 65535


def flat_grid(*sizes: int) -> tuple:
    """The grid of a kernel with one program per index of `sizes` (fastest first, the (batch,
    head) index last), flattened onto axis 0 and read back by `tiles.flat_program`.

    Program p = i_0 + N0 * (i_1 + N1 * i_bh) runs p-th, as it did on the grid (N0, N1, B * H):
    the blocks of one chunk, then the chunks of one head, still run together, and neither B * H
    nor the chunks meet the 65535 of axes 1 and 2. A count past axis 0 is split exactly over
    axes 0 and 1, (count / R, R) with R the smallest divisor that fits, in the same order;
    R = N0 * N1 fits whenever B * H < 2^31 and N0 * N1 <= 65535.
    """
    count = math.prod(sizes)
    for rows in range(triton.cdiv(count, GRID_AXIS_0), GRID_AXES_1_2 + 1):
        if count % rows == 0:
            return (count,) if rows == 1 else (count // rows, rows)
    raise ValueError(f"{count} programs {sizes} fit no CUDA grid")


_COMPILE_ONLY = contextvars.ContextVar("fla_kernels_compile_only", default=False)
_SEEN: set = set()
_POOL: list = []


def launch(kernel, grid, *args, **kwargs):
    """kernel[grid](*args, **kwargs); inside a dry run of `compiles_ahead`, only compile it."""
    if not _COMPILE_ONLY.get():
        kernel[grid](*args, **kwargs)
    elif not interpreting():
        kernel.warmup(*args, grid=grid, **kwargs)


def compile_ahead_available() -> bool:
    """Whether a first call can compile its kernels at once here."""
    return AsyncCompileMode is not None and not interpreting() and active_mode.get() is None


def _describe(x):
    """What of an argument can change the kernels a pass compiles: dtypes, ranks, the last
    dimension of a matrix or more (head sizes), flags and integers; not batch or length, nor the
    length of a vector (a packed batch's chunk offsets: its number of sequences), none of which
    is specialised on."""
    if isinstance(x, torch.Tensor):
        return ("tensor", x.dtype, x.dim(), x.shape[-1] if x.dim() > 1 else None, x.device)
    if isinstance(x, (tuple, list)):
        return tuple(_describe(y) for y in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _describe(v)) for k, v in x.items()))
    if x is None or isinstance(x, (bool, int, str, torch.dtype)):
        return x
    return type(x).__name__


def _pool() -> ThreadPoolExecutor:
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1),
                                        thread_name_prefix="fla_kernels-compile"))
    return _POOL[0]


def _dry_run(fn, args, kwargs):
    """fn(*args, **kwargs) with every launch compiled in parallel and none run."""
    token = _COMPILE_ONLY.set(True)
    try:
        with AsyncCompileMode(_pool()):
            fn(*args, **kwargs)
    except Exception:  # the real run meets the same problem and reports it
        pass
    finally:
        _COMPILE_ONLY.reset(token)


def _configuration(fn, args, kwargs):
    """The key of a call: fn and `_describe` of its arguments. An autograd context (the first
    argument of a Function's forward / backward) stands for which inputs need gradients and, in
    the backward, for the forward's key, which the forward leaves on it."""
    ctx = args[0] if args and isinstance(args[0], FunctionCtx) else None
    if ctx is None:
        return (fn.__module__, fn.__qualname__, _describe(args), _describe(kwargs))
    key = (fn.__module__, fn.__qualname__, _describe(args[1:]), _describe(kwargs),
           tuple(ctx.needs_input_grad), getattr(ctx, "_fla_kernels_key", None))
    ctx._fla_kernels_key = key
    return key


def compiles_ahead(fn):
    """fn, a pass that launches kernels through `launch` (or an autograd Function's forward or
    backward), compiling them all at once the first time it meets a configuration in this
    process."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not _COMPILE_ONLY.get() and compile_ahead_available():
            key = _configuration(fn, args, kwargs)
            if key not in _SEEN:
                _SEEN.add(key)
                _dry_run(fn, args, kwargs)
        return fn(*args, **kwargs)

    return wrapper
