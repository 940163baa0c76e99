"""Run one case: golden, baseline, every implementation and the registered checks, as rows."""
from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from harness.allocations import nan_filled_allocations, package_of
from harness.cases import DTYPE_NAMES, Case
from harness.checks import EXTRA_CHECKS, CaseContext, registered
from harness.execution import (Execution, RunFailed, describe_error, rejected_or_error, run_implementation,
                               unsupported)
from harness.goldens import golden_and_baseline
from harness.inputs import CaseInputs, make_inputs
from harness.metrics import compare_sums, compare_to_golden, compare_variants, few_chunk_sums
from harness.packing import name_sequences
from harness.redraws import baseline_redraws
from harness.sampling import Sample, choose_sample
from harness import upstream
from harness.declaration import OpSpec, load_function
from harness.tolerance import tolerance_for



@dataclass(frozen=True)
class Implementation:
    """One function under test: the variant it stands for and the label its rows carry."""
    variant: str
    impl: str
    fn: Callable


def implementations(spec: OpSpec, variants, external: dict, releases: dict | None = None, note: str = ""
                    ) -> list[Implementation]:
    """Our variants, with any `external` {variant: 'module:function'} put in their place, labelled
    with their release where `releases` {variant: 'fla 0.6.0 (fla-core)'} names one, and with
    `note` (how they were run, e.g. `autotune_mode.NOTE`)."""
    result = []
    releases = releases or {}
    for variant in variants:
        if variant in external:
            target = external[variant]
            fn = upstream.set_function(target, spec) if variant in releases else load_function(target)
            said = "; ".join(part for part in (releases.get(variant), note) if part)
            label = target + (f" [{said}]" if said else "")
            result.append(Implementation(variant, label, fn))
        else:
            result.append(Implementation(variant, "ours", spec.variant_fn(variant)))
    return result


def expected_tensors(spec: OpSpec, case: Case) -> list[str]:
    """o, the final states, the gradients of the inputs passed (and differentiable), dh0."""
    spec = spec.under(case.option)
    passed = [s for s in spec.inputs if s.grad and s.name not in spec.option_spec().without]
    names = ["o"] + spec.final_state_names() + ["d" + s.name for s in passed]
    return names + (spec.initial_state_grad_names() if case.h0 == "grad" else [])


def contract_dtypes(spec: OpSpec, case: Case, inputs: CaseInputs) -> dict:
    """The dtype each returned tensor must have: o in the activations' dtype, input gradients in
    their input's, states fp32."""
    dtypes = {"o": case.torch_dtype}
    dtypes.update({name: torch.float32 for name in spec.final_state_names() + spec.initial_state_grad_names()})
    dtypes.update({"d" + name: x.dtype for name, x in inputs.tensors.items()})
    return dtypes


def _seq_layout(spec: OpSpec, tensor: str) -> bool:
    return tuple(spec.tensor_shapes().get(tensor, ())[:3]) == ("B", "T", "H")


UNSAMPLED = ("a parameter shared by every batch row and sequence has no golden on a sample of them "
             "(the case is too large for a whole float64 golden)")


def case_context(spec: OpSpec, case: Case, device, cache=None) -> CaseContext:
    """The case's inputs, golden and baseline (through `cache`), tolerances, and what the checks
    call on them (`CaseContext`); raises what drawing the inputs or the references raise."""
    spec = spec.under(case.option)
    full = make_inputs(spec, case, device)
    sample = choose_sample(spec, case, full)
    inputs = full if sample is None else sample.inputs(spec, full)   # what the references take
    golden, baseline = golden_and_baseline(spec, case, inputs, cache)
    shapes = spec.tensor_shapes()
    expected = expected_tensors(spec, case)
    names = [n for n in expected if sample is None or Sample.covers(shapes[n])]
    summed = [n for n in names if n != "o" and _seq_layout(spec, n)]
    few = [n for n in summed if few_chunk_sums(golden[n].shape, spec.baseline_chunk_size)]
    redraws = baseline_redraws(spec, case, inputs) if few else []
    dtypes = contract_dtypes(spec, case, inputs)
    tolerances = {name: tolerance_for(case.op, name, case.activation_dtype, inputs.longest,
                                      DTYPE_NAMES[dtypes[name]]) for name in names}

    def take(name, out):
        """The part of a result that the golden covers: all of it, or the sample's."""
        x = out.get(name)
        return x if sample is None else sample.take(shapes[name], x)

    def against_golden(out, name, references=None):
        gold, base = references or (golden, baseline)
        metrics = compare_to_golden(take(name, out), gold[name], base[name], tolerances[name],
                                    _seq_layout(spec, name), dtypes[name])
        if sample is not None and metrics.get("message"):
            metrics["message"] += f" (golden on a sample: {sample.describe(case.packed)})"
        return name_sequences(metrics, inputs.bounds)

    option_references = {"one call": (golden, baseline)}

    def references_for(label, options, **known):
        if label not in option_references:
            option_references[label] = golden_and_baseline(spec, case, inputs, cache, **known,
                                                           **options)
        return option_references[label]

    def run(impl, wrap=None, **options):
        return _timed_run(wrap(impl.fn) if wrap else impl.fn, spec, case, full, device,
                          package_of(impl.fn), **options)

    context = CaseContext(spec, case, full, device, names, against_golden, references_for, run,
                       row=functools.partial(_row, case), golden=golden, baseline=baseline,
                       dtypes=dtypes, tolerances=tolerances,
                       derive=lambda other: case_context(spec, other, device, cache),
                       agreement=lambda *sides: agreement(context, *sides), take=take, sample=sample,
                       unsampled=[n for n in expected if n not in names], reference_inputs=inputs,
                       sum_baselines={n: [baseline[n]] + [d[n] for d in redraws if n in few] for n in summed})
    return context


def run_case(spec: OpSpec, case: Case, impls: list[Implementation], device,
             checks=EXTRA_CHECKS, cache=None, where: dict | None = None) -> list[dict]:
    """Every row of one case. An implementation that raises becomes an ERROR row; nothing else stops.

    Per implementation: one "golden" row per tensor, "aggregate" rows for each gradient of a
    sequence input (its sums over tokens, and over batch, tokens and heads), then those of the
    registered checks named in `checks` (`harness/checks/`) that apply to it; per pair of
    variants, "agreement" rows. An implementation that returns a wrong shape or whose backward
    raises keeps the golden rows of the outputs it returned right, beside its ERROR row; one
    that does not take the case's option or packing gets a SKIP row saying so. `cache`:
    a GoldenCache for the goldens and baselines, or None. `where["step"]` names the step under
    way and `where["variant"]` the implementation running it, None outside one (for an error that
    escapes the case: a GPU error surfaces at a later call than its kernel's; and for a process
    that dies in it: `where` may write itself to disk, harness.supervisor.CaseInProgress).
    """
    where = {} if where is None else where
    rows = []
    where.update(variant=None, step="the goldens")
    try:
        context = case_context(spec, case, device, cache)
    except Exception as exc:  # the references failing is reported, not fatal
        return [run_row(case, impl, "ERROR", f"golden or baseline failed: {describe_error(exc)}")
                for impl in impls]
    spec, names, golden, baseline = context.spec, context.names, context.golden, context.baseline
    against_golden = context.against_golden
    selected = registered(checks)

    results, goldens = {}, {}   # variant -> its outputs; (variant, tensor) -> its golden row
    for impl in impls:
        label = f"{impl.variant} ({impl.impl})"
        where.update(variant=impl.variant, step=f"{label}: its run")
        reason = unsupported(impl.fn, spec, case)
        if reason:
            rows.append(run_row(case, impl, "SKIP", reason))
            continue
        start = time.perf_counter()
        try:
            run = context.run(impl)
        except RunFailed as exc:
            wall = time.perf_counter() - start
            rows += [_row(case, impl, "golden", name, wall_s=wall, **against_golden(exc.forward, name))
                     for name in names if name in exc.forward]
            rows.append(run_row(case, impl, exc.verdict, describe_error(exc), tensor=exc.tensor))
            if exc.in_backward:
                forward = Execution(exc.forward, {}, backward=False)
                for check in selected:
                    if check.forward_only and check.applies(context, impl):
                        where["step"] = f"{label}: the {check.name} check of its forward"
                        rows.extend(check.rows(context, impl, forward))
            _release(device)
            continue
        except Exception as exc:
            rows.append(run_row(case, impl, *rejected_or_error(exc, case)))
            _release(device)
            continue
        wall = time.perf_counter() - start
        results[impl.variant] = run.result
        for name in names:
            metrics = against_golden(run.result, name)
            goldens[(impl.variant, name)] = metrics
            rows.append(_row(case, impl, "golden", name, wall_s=wall, **metrics))
        rows += [_row(case, impl, "golden", name, verdict="SKIP", message=UNSAMPLED)
                 for name in context.unsampled]
        for name, draws in context.sum_baselines.items():
            rows += [_row(case, impl, "aggregate", f"{name} (sum over {over})", **metrics)
                     for over, metrics in compare_sums(context.take(name, run.result), golden[name], draws,
                                                       context.tolerances[name], context.dtypes[name],
                                                       case.B * case.H > 1, spec.baseline_chunk_size)]
        for check in selected:
            if check.applies(context, impl):
                where["step"] = f"{label}: the {check.name} check"
                rows.extend(check.rows(context, impl, run))
    where.update(variant=None, step="the agreement rows")
    for a, b in itertools.combinations([i for i in impls if i.variant in results], 2):
        for name in names:
            rows.append({**_case_fields(case), "variant": f"{a.variant}~{b.variant}",
                         "impl": f"{a.impl}~{b.impl}", "check": "agreement", "tensor": name,
                         **context.agreement(name, goldens[(a.variant, name)], goldens[(b.variant, name)],
                                             results[a.variant], results[b.variant])})
    where["step"] = "the case's end (its memory freed after every check)"
    _release(device)
    return rows


def agreement(context: CaseContext, name: str, side_a: dict, side_b: dict, a: dict, b: dict) -> dict:
    """Metrics of two runs' tensor `name` against each other, within the sum of their golden rows'
    bounds (and floors and atols, the gate's noise model), `side_a` and `side_b`."""
    bound, floor, atol = (sum(side.get(k, math.nan) for side in (side_a, side_b))
                          for k in ("bound", "floor", "atol"))
    metrics = compare_variants(context.take(name, a), context.take(name, b), context.golden[name], bound,
                               _seq_layout(context.spec, name), floor, atol)
    return name_sequences(metrics, context.reference_inputs.bounds)


def _timed_run(fn, spec, case, inputs, device, package=None, **options) -> Execution:
    """run_implementation with unwritten memory of our kernels and of the implementation's own
    package (`package`) poisoned, synchronised on a GPU."""
    with nan_filled_allocations("fla_kernels", package):
        run = run_implementation(fn, spec, case, inputs, **options)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return run


def _row(case: Case, impl: Implementation, check: str, tensor: str, **fields) -> dict:
    return {**_case_fields(case), "variant": impl.variant, "impl": impl.impl, "check": check,
            "tensor": tensor, **fields}


def _case_fields(case: Case) -> dict:
    return {"case_id": case.case_id, **case.as_dict()}


def run_row(case: Case, impl: Implementation, verdict: str, message: str, tensor: str = "") -> dict:
    return _row(case, impl, "run", tensor, verdict=verdict, message=message)


def _release(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
