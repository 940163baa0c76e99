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

from dataclasses import dataclass
from typing import Callable


@dataclass
class CaseContext:
    """What a check needs of the case under way: its op, case, inputs and device; the tensors it
    returns (`names`); `against_golden(out, name, references=None)`, the metrics of one tensor
    against the case's golden and baseline or other `references`; `references_for(label,
    options, **known)`, the golden and baseline of the case run with `options` (computed once per
    label); `run(impl, **options)`, one forward and backward (an `Execution`); `row(impl, check,
    tensor, **fields)`, a result row."""
    spec: object
    case: object
    inputs: object
    device: object
    names: list
    against_golden: Callable
    references_for: Callable
    run: Callable
    row: Callable


@dataclass(frozen=True)
class Check:
    """One check: `rows(ctx, impl, execution)` are its rows for an implementation whose run gave
    `execution`; `applies(ctx, impl)` says whether it runs for that implementation at all."""
    name: str
    rows: Callable
    group: tuple = ()
    applies: Callable = lambda ctx, impl: True


from harness.checks import determinism, inputs, layer, options, segments  # noqa: E402

REGISTRY = (inputs.CHECK, determinism.CHECK, segments.CHECK, options.CHECK, layer.CHECK)
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
