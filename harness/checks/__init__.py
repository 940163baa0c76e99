"""The checks beyond the golden: each is one module here that declares a `Check` (its name, where
it runs and its rows), and `REGISTRY` lists them in the order their rows are written. The runner
runs what is registered; `--checks` picks among them by name.

Every implementation of every case gets its "golden" and "aggregate" rows and each pair of
variants its "agreement" rows (`harness/runner.py`); a registered check adds its own rows per
implementation. A check with a `group` runs on the first case with T > 1 of each group of the plan
(the case fields it names), as it exercises argument handling or a layer rather than numerics
that change with every shape; without one it runs on every case it `applies` to.
"""
from __future__ import annotations

from harness.checks import causality, determinism, inference, inputs, layer, options, packing, segments
from harness.checks.check import CaseContext, Check

__all__ = ["CaseContext", "Check", "REGISTRY", "EXTRA_CHECKS", "registered", "checks_per_case"]

REGISTRY = (inputs.CHECK, determinism.CHECK, segments.CHECK, causality.CHECK, packing.CHECK, inference.CHECK,
            options.CHECK, layer.CHECK)
EXTRA_CHECKS = tuple(check.name for check in REGISTRY)


def registered(names) -> list[Check]:
    """The registered checks among `names`, in the registry's order."""
    return [check for check in REGISTRY if check.name in names]


def checks_per_case(plan, names) -> list[tuple]:
    """The checks each planned case runs, from the plan alone, so a resumed run gives each check to
    the same case as an uninterrupted one: a check with a group on the first case with T > 1 of
    each of its groups, the others on every case."""
    covered, out = set(), []
    for _, case, _ in plan:
        keep = []
        for check in registered(names):
            if check.group:
                key = (check.name, *(getattr(case, field) for field in check.group))
                if key in covered or case.T < 2:
                    continue
                covered.add(key)
            keep.append(check.name)
        out.append(tuple(keep))
    return out
