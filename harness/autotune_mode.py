"""`sweep --autotune first`: every Triton autotuner runs the first config it would have timed.

An external implementation autotunes its first calls: each kernel compiles and times every config
of its list for each new key (head dim, dtype, ...), minutes per kernel on an empty cache (fla
0.6.0's gsa took 8 minutes a case at K = V = 128 on an H100). Every config a kernel declares must
compute the same thing, so a correctness sweep may take one: with this mode each autotuner keeps
the first config left after the kernel's own pruning, and compiles and times that one alone. Its
rows name the mode beside their release (`NOTE`), and upstream's own choice, the config its
users run, stays the default. The one-config timing writes Triton's autotune cache under a key of
its own, so a later full autotune is not handed the first config as its winner.
"""
from __future__ import annotations

MODES = ("upstream", "first")
NOTE = "first config of each autotuner"


def first_config_only() -> None:
    """Make every Triton autotuner of this process keep only the first of its pruned configs."""
    from triton.runtime.autotuner import Autotuner
    pruned = Autotuner.prune_configs
    if getattr(pruned, "keeps_first", False):
        return

    def keep_first(self, kwargs):
        return pruned(self, kwargs)[:1]

    keep_first.keeps_first = True
    Autotuner.prune_configs = keep_first
