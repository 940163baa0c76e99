"""Small autotuned Triton kernels for the tests of how the harness runs upstream's autotuners
(tests/test_interpreted_upstream.py, tests/test_autotune_mode.py)."""
import triton
import triton.language as tl


def _without_the_narrowest(configs, named_args, **kwargs):
    """The kernel's own pruning: its first declared config is never eligible."""
    return [c for c in configs if c.kwargs["WIDTH"] > 2]


@triton.autotune(configs=[triton.Config({"WIDTH": w}) for w in (2, 4, 8)], key=["n"],
                 prune_configs_by={"early_config_prune": _without_the_narrowest})
@triton.jit
def doubled_with_width(x, y, width, n, WIDTH: tl.constexpr):
    """y = 2 x on the first WIDTH elements; `width` holds the WIDTH it ran with (4 or 8)."""
    o = tl.arange(0, WIDTH)
    tl.store(y + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)
    tl.store(width, WIDTH)


@triton.autotune(configs=[triton.Config({"WIDTH": w}) for w in (4, 8)], key=["n"], reset_to_zero=["y"])
@triton.jit
def summed_with_width(x, y, n, WIDTH: tl.constexpr):
    """y += x on the first n elements, atomically: y must start at zero, as its autotuner's
    reset_to_zero leaves it before each timed run and after the timing."""
    o = tl.arange(0, WIDTH)
    tl.atomic_add(y + o, tl.load(x + o, mask=o < n), mask=o < n)
