"""A small autotuned Triton kernel for the tests of how the harness runs upstream's autotuners
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
