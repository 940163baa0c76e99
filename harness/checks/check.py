"""What a check is (`Check`) and what it is given of the case under way (`CaseContext`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass
class CaseContext:
    """What a check needs of the case under way: its op, case, inputs and device; the tensors it
    returns (`names`); `against_golden(out, name, references=None)`, the metrics of one tensor
    against the case's golden and baseline or other `references`; `references_for(label,
    options, **known)`, the golden and baseline of the case run with `options` (computed once per
    label); `run(impl, wrap=None, **options)`, one forward and backward (an `Execution`) of
    impl's function or of `wrap(function)`; `row(impl, check, tensor, **fields)`, a result row."""
    spec: object
    case: object
    inputs: object
    device: object
    names: list
    against_golden: Callable
    references_for: Callable
    run: Callable
    row: Callable
    golden: dict = None        # tensor -> the float64 golden
    baseline: dict = None      # tensor -> the same-dtype baseline
    dtypes: dict = None        # tensor -> the dtype the contract promises
    tolerances: dict = None    # tensor -> its Tolerance
    derive: Callable = None    # derive(case): the context of another case of the op (an option)
    agreement: Callable = None  # agreement(name, side_a, side_b, a, b): two runs' tensor compared
    take: Callable = None      # take(name, results): the part of a result the golden covers
    sample: object = None      # the Sample the golden is on (harness/sampling.py), or None: whole
    unsampled: list = None     # tensors a sampled golden cannot cover (parameters shared by rows)
    reference_inputs: object = None   # the inputs the references took: `inputs`, or the sample's
    sum_baselines: dict = None  # gradient summed over tokens -> the baseline's draws (harness/redraws.py)


@dataclass(frozen=True)
class Check:
    """One check: `rows(ctx, impl, execution)` are its rows for an implementation whose run gave
    `execution`; `applies(ctx, impl)` says whether it runs for that implementation at all;
    `forward_only`, whether it also runs, with an execution of the forward alone
    (`backward=False`), for an implementation whose backward failed or is absent."""
    name: str
    rows: Callable
    group: tuple = ()
    applies: Callable = lambda ctx, impl: True
    forward_only: bool = False
