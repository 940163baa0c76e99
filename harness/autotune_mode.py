"""`sweep --autotune first`: every Triton autotuner runs the first config it would have timed.

An external implementation autotunes its first calls: each kernel compiles and times every config
of its list for each new key (head dim, dtype, ...), minutes per kernel on an empty cache (fla
0.6.0's gsa took 8 minutes a case at K = V = 128 on an H100). Every config a kernel declares must
compute the same thing, so a correctness sweep may take one: with this mode each autotuner keeps
the first config left after the kernel's own pruning that fits the device, and compiles and
times that one alone (and any before it, to find that they do not fit). A config that does not
fit (Triton's timing reports it as infinitely slow: out of shared memory or registers, a failed
compile-time assertion) is one upstream's own autotuning passes over, so this mode passes over
it too instead of raising where upstream's users do not (fla 0.4.2's chunk_gated_delta_rule
backward at fp32 on an H200: its first config needs 271,116 bytes of shared memory of 232,448).
Its rows name the mode beside their release (`NOTE`), and upstream's own choice, the config its
users run, stays the default. The one-config timing writes Triton's autotune cache under a key
of its own, so a later full autotune is not handed the first config as its winner.
"""
from __future__ import annotations

import math

MODES = ("upstream", "first")
NOTE = "first config of each autotuner"


def first_config_only() -> None:
    """Make every Triton autotuner of this process keep only the first of its pruned configs that
    fits: each is timed in turn until one does (the last is kept untried, to fail as upstream's
    would where none fits)."""
    from triton.runtime.autotuner import Autotuner
    pruned = Autotuner.prune_configs
    if getattr(pruned, "keeps_first", False):
        return

    def keep_first(self, kwargs):
        configs = pruned(self, kwargs)
        args = list(self.nargs.values())   # the call's positional arguments, in order
        for config in configs[:-1]:
            if math.isfinite(self._bench(*args, config=config, **kwargs)[0]):
                # zero the kernel's reset_to_zero outputs again, as Triton does after its timing:
                # a Triton that skips timing a lone config would run on top of the timed runs
                self.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()}, reset_only=True)
                return [config]
        return configs[-1:]

    keep_first.keeps_first = True
    Autotuner.prune_configs = keep_first
