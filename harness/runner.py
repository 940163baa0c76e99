"""Run one case: golden, baseline, every implementation, and turn the results into rows."""
from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from fla_kernels.utils import interpreting
from harness.cases import DTYPES, Case
from harness.checks import (bitwise_equal, describe_difference, nan_filled_allocations,
                            segment_bounds)
from harness.inputs import CaseInputs, make_inputs
from harness.layer_checks import layer_rows
from harness.metrics import compare_sums, compare_to_golden, compare_variants
from harness.registry import OpSpec, load_function
from reports.schema import FINAL_STATE_UNUSED
from harness.tolerance import tolerance_for


DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
EXTRA_CHECKS = ("inputs", "determinism", "segments", "options", "layer")  # beyond the golden


def can_race(impl: "Implementation") -> bool:
    """Whether running `impl` twice can show a difference: not for our Triton kernels under the
    interpreter, which runs every program serially; for every other implementation, yes."""
    return not (impl.impl == "ours" and interpreting())


@dataclass(frozen=True)
class Implementation:
    """One function under test: the variant it stands for and the label its rows carry."""
    variant: str
    impl: str
    fn: Callable


def implementations(spec: OpSpec, variants, external: dict) -> list[Implementation]:
    """Our variants, with any `external` {variant: 'module:function'} put in their place."""
    result = []
    for variant in variants:
        if variant in external:
            result.append(Implementation(variant, external[variant], load_function(external[variant])))
        else:
            result.append(Implementation(variant, "ours", spec.variant_fn(variant)))
    return result


@dataclass
class Execution:
    """What one forward and backward of an implementation gave."""
    result: dict   # tensor name ("o", "ht", "dq", "dh0", ...) -> output or gradient (None if absent)
    given: dict    # input name -> (the tensor the implementation received, the original it copies)


class RunFailed(Exception):
    """An implementation's run stopped before its gradients: it returned something the op does not
    (`tensor` names it), or its backward raised. `forward` holds the outputs it returned that
    match the op, which are still compared with the golden."""

    def __init__(self, message: str, forward: dict, tensor: str = ""):
        super().__init__(message)
        self.forward, self.tensor = forward, tensor


def _shape_text(shape, symbols) -> str:
    return f"({', '.join(map(str, shape))}) [{', '.join(symbols)}]"


def returned_problems(spec: OpSpec, case: Case, returned, t0: int, t1: int) -> tuple[dict, dict]:
    """({name: tensor} of the forward outputs that match the op, {name: why} of those that do not)
    for what one call over steps [t0, t1) returned: (o, final state), with o [B, t1 - t0, H, V]
    and each state its declared shape, floating point."""
    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        what = type(returned).__name__ + (f" of {len(returned)}" if isinstance(returned, (tuple, list)) else "")
        return {}, {"o": f"the call returned a {what}; the op returns the pair (o, final state)"}
    o, finals = returned
    dims = {**case.dims(), "T": t1 - t0}
    wanted = [("o", o, ("B", "T", "H", "V"))]
    if finals is not None:
        finals_tuple = (finals,) if len(spec.states) == 1 else finals
        if not isinstance(finals_tuple, (tuple, list)) or len(finals_tuple) != len(spec.states):
            return ({}, {spec.final_state_names()[0]: f"the final state is a {type(finals).__name__}; "
                         f"the op's is a tuple of {len(spec.states)} tensors"})
        wanted += [(name, x, st.shape) for name, x, st in
                   zip(spec.final_state_names(), finals_tuple, spec.states)]
    good, bad = {}, {}
    for name, x, symbols in wanted:
        expected = tuple(dims[d] for d in symbols)
        if x is None and name != "o":
            good[name] = None
        elif not isinstance(x, torch.Tensor):
            bad[name] = f"{name} is a {type(x).__name__}, not a tensor"
        elif not x.is_floating_point():
            bad[name] = f"{name} is {str(x.dtype).replace('torch.', '')}, not floating point"
        elif tuple(x.shape) != expected:
            bad[name] = (f"{name} has shape {_shape_text(tuple(x.shape), symbols)}; the op's is "
                         f"{_shape_text(expected, symbols)}")
        else:
            good[name] = x
    return good, bad


def run_implementation(fn, spec: OpSpec, case: Case, inputs: CaseInputs, to_dtype=None,
                       segments=None, final_state="grad", without=(), h0_grad=True) -> Execution:
    """Forward and backward with the shared upstream gradients.

    Inputs are cloned first (optionally cast to `to_dtype`), so no implementation sees another's
    tensors; `given` keeps the copies to check afterwards that none was written to. An op with one
    state takes and returns it as a tensor, with several as tuples. With `segments` ([(t0, t1)...])
    the forward runs once per segment of T, each taking the previous one's final state, and the
    backward runs through the whole chain. final_state: "grad" (returned, its upstream gradient in
    the loss), "unused" (returned, not in the loss) or "off" (output_final_state=False); the
    inputs named in `without` are passed as None; h0_grad=False passes a case's initial state
    without requires_grad. What each call returns is checked against the op before anything
    else uses it: RunFailed names a wrong shape or type, and a backward that raises.
    """
    def leaf(x, grad=True):
        x = x.detach().clone() if to_dtype is None else x.detach().to(to_dtype)
        return x.requires_grad_(grad)

    def upstream(x):
        return x.detach().clone() if to_dtype is None else x.detach().to(to_dtype)

    single = len(spec.states) == 1
    leaves = {name: leaf(x) for name, x in inputs.tensors.items() if name not in without}
    given = {name: (x, inputs.tensors[name]) for name, x in leaves.items()}
    h0 = None
    if inputs.initial_states is not None:
        h0 = tuple(leaf(x, grad=case.h0 == "grad" and h0_grad) for x in inputs.initial_states)
        given.update({f"initial {s.name}": (x, orig) for s, x, orig in
                      zip(spec.states, h0, inputs.initial_states)})
    sequence = {s.name for s in spec.inputs if tuple(s.shape[:2]) == ("B", "T")}
    pieces, finals = [], h0
    for t0, t1 in segments or [(0, case.T)]:
        args = [leaves.get(name) for name in inputs.tensors]
        args = [x[:, t0:t1] if name in sequence and x is not None else x
                for name, x in zip(inputs.tensors, args)]
        state = None if finals is None else (finals[0] if single else finals)
        returned = fn(*args, scale=inputs.scale, initial_state=state,
                      output_final_state=final_state != "off" or t1 < case.T)
        good, bad = returned_problems(spec, case, returned, t0, t1)
        if bad:
            name, why = next(iter(bad.items()))
            where = f" (segment [{t0}, {t1}))" if segments else ""
            forward = {} if segments else {k: v.detach() for k, v in good.items() if v is not None}
            raise RunFailed(f"returned wrong{where}: {why}", forward, name)
        o, finals = returned
        pieces.append(o)
        finals = (finals,) if single else finals
    o = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
    if finals is None:
        finals = (None,) * len(spec.states)
    do = upstream(inputs.do)
    dhts = tuple(upstream(x) for x in inputs.dhts)
    given["the upstream gradient of o"] = (do, inputs.do)
    outputs, grads = [o], [do]
    for s, final, dht, orig in zip(spec.states, finals, dhts, inputs.dhts):
        given[f"the upstream gradient of {s.name}t"] = (dht, orig)
        if final is not None and final_state == "grad":
            outputs.append(final)
            grads.append(dht)
    result = {"o": o.detach()}
    for name, final in zip(spec.final_state_names(), finals):
        result[name] = None if final is None else final.detach()
    try:
        torch.autograd.backward(outputs, grads)
    except Exception as exc:
        raise RunFailed(f"backward raised {describe_error(exc)}",
                        {} if segments else {k: v for k, v in result.items() if v is not None}) from exc
    for name, x in leaves.items():
        result["d" + name] = x.grad
    if case.h0 == "grad" and h0_grad:
        for name, x in zip(spec.initial_state_grad_names(), h0):
            result[name] = x.grad
    return Execution(result, given)


def execute(fn, spec: OpSpec, case: Case, inputs: CaseInputs, to_dtype=None, **options) -> dict:
    """Every output and gradient of one forward and backward (see run_implementation)."""
    return run_implementation(fn, spec, case, inputs, to_dtype, **options).result


def golden_and_baseline(spec: OpSpec, case: Case, inputs: CaseInputs, cache=None, golden=None,
                        **options) -> tuple[dict, dict]:
    """The float64 golden (loop for short T, chunked form beyond) and the same-dtype baseline,
    taken from `cache` (a GoldenCache) when it has them, and stored there when computed.

    `golden` given: only the baseline is computed (a chain of segments changes the rounding of
    the same-dtype arithmetic, not the float64 truth)."""
    if cache is not None:
        found = cache.get(spec, case, options, inputs.do.device)
        if found is not None:
            return found
    loop = load_function(spec.reference_loop)
    chunked = load_function(spec.reference_chunked)
    golden_fn = loop if case.T <= spec.loop_max_T else chunked
    if golden is None:
        golden = execute(golden_fn, spec, case, inputs, to_dtype=torch.float64, **options)
    baseline_fn = functools.partial(chunked, operand_dtype=case.torch_dtype,
                                    chunk_size=spec.baseline_chunk_size)
    baseline = execute(baseline_fn, spec, case, inputs, **options)
    if cache is not None:
        cache.put(spec, case, options, golden, baseline)
    return golden, baseline


def option_settings(spec: OpSpec, case: Case) -> list[tuple[str, dict]]:
    """(label, run_implementation options) of the optional-argument combinations beyond the case's:
    no final state, a final state left out of the loss, the initial state given without gradient
    (when the case's has one), and each optional input passed as None."""
    settings = [("no final state", {"final_state": "off"}),
                (FINAL_STATE_UNUSED, {"final_state": "unused"})]
    if case.h0 == "grad":
        settings.append(("initial state without gradient", {"h0_grad": False}))
    return settings + [(f"{s.name}=None", {"without": (s.name,)}) for s in spec.inputs if s.optional]


def expected_tensors(spec: OpSpec, case: Case) -> list[str]:
    names = ["o"] + spec.final_state_names() + ["d" + s.name for s in spec.inputs]
    return names + (spec.initial_state_grad_names() if case.h0 == "grad" else [])


def contract_dtypes(spec: OpSpec, case: Case, inputs: CaseInputs) -> dict:
    """The dtype each returned tensor must have: o and input gradients in the inputs' dtype, states fp32."""
    dtypes = {"o": case.torch_dtype}
    dtypes.update({name: torch.float32 for name in spec.final_state_names() + spec.initial_state_grad_names()})
    dtypes.update({"d" + name: x.dtype for name, x in inputs.tensors.items()})
    return dtypes


def _seq_layout(spec: OpSpec, tensor: str) -> bool:
    if tensor == "o":
        return True
    shapes = {"d" + s.name: s.shape for s in spec.inputs}
    return shapes.get(tensor, ())[:3] == ("B", "T", "H")


def run_case(spec: OpSpec, case: Case, impls: list[Implementation], device,
             checks=EXTRA_CHECKS, cache=None, where: dict | None = None) -> list[dict]:
    """Every row of one case. An implementation that raises becomes an ERROR row; nothing else stops.

    Per implementation: one "golden" row per tensor, "aggregate" rows for each gradient of a
    sequence input (its sums over tokens, and over batch, tokens and heads), then those of
    `checks`: "inputs", "determinism" (where the implementation can race: `can_race`),
    "segments" (harness/checks.py), for T <= the op's loop_max_T (their goldens are extra
    float64 runs) "options", and "layer" (harness/layer_checks.py); per pair of variants,
    "agreement" rows. An implementation that returns a wrong shape or whose backward raises
    keeps the golden rows of the outputs it returned right, beside its ERROR row. `cache`: a
    GoldenCache for the goldens and baselines, or None. `where["step"]` names the step under way
    (for an error that escapes the case: a GPU error surfaces at a later call than its kernel's).
    """
    where = {} if where is None else where
    rows = []
    where["step"] = "the goldens"
    try:
        inputs = make_inputs(spec, case, device)
        golden, baseline = golden_and_baseline(spec, case, inputs, cache)
    except Exception as exc:  # the references failing is reported, not fatal
        return [run_row(case, impl, "ERROR", f"golden or baseline failed: {describe_error(exc)}")
                for impl in impls]
    names = expected_tensors(spec, case)
    dtypes = contract_dtypes(spec, case, inputs)
    tolerances = {name: tolerance_for(case.op, name, case.dtype, case.T, DTYPE_NAMES[dtypes[name]])
                  for name in names}

    def against_golden(out, name, references=(golden, baseline)):
        gold, base = references
        return compare_to_golden(out.get(name), gold[name], base[name], tolerances[name],
                                 _seq_layout(spec, name), dtypes[name])

    option_references = {"one call": (golden, baseline)}

    def references_for(label, options, **known):
        if label not in option_references:
            option_references[label] = golden_and_baseline(spec, case, inputs, cache, **known,
                                                           **options)
        return option_references[label]

    results, goldens = {}, {}   # variant -> its outputs; (variant, tensor) -> its golden row
    for impl in impls:
        label = f"{impl.variant} ({impl.impl})"
        where["step"] = f"{label}: its run"
        start = time.perf_counter()
        try:
            run = _timed_run(impl.fn, spec, case, inputs, device)
        except RunFailed as exc:
            wall = time.perf_counter() - start
            rows += [_row(case, impl, "golden", name, wall_s=wall, **against_golden(exc.forward, name))
                     for name in names if name in exc.forward]
            rows.append(run_row(case, impl, "ERROR", describe_error(exc), tensor=exc.tensor))
            _release(device)
            continue
        except Exception as exc:
            rows.append(run_row(case, impl, "ERROR", describe_error(exc)))
            _release(device)
            continue
        wall = time.perf_counter() - start
        results[impl.variant] = run.result
        for name in names:
            metrics = against_golden(run.result, name)
            goldens[(impl.variant, name)] = metrics
            rows.append(_row(case, impl, "golden", name, wall_s=wall, **metrics))
        for name in names:
            if _seq_layout(spec, name) and name != "o":
                rows += [_row(case, impl, "aggregate", f"{name} (sum over {over})", **metrics)
                         for over, metrics in compare_sums(run.result.get(name), golden[name],
                                                           baseline[name], tolerances[name],
                                                           dtypes[name], case.B * case.H > 1)]
        if "inputs" in checks:
            where["step"] = f"{label}: the inputs check"
            rows.append(_inputs_row(case, impl, run))
        if "determinism" in checks and can_race(impl):
            where["step"] = f"{label}: the determinism check"
            rows.append(_determinism_row(spec, case, impl, inputs, device, run.result, names))
        if "segments" in checks:
            where["step"] = f"{label}: the segments check"
            rows.extend(_segment_rows(spec, case, impl, inputs, device, names, against_golden,
                                      references_for))
        if "options" in checks and case.T <= spec.loop_max_T:
            where["step"] = f"{label}: the options check"
            rows.extend(_option_rows(spec, case, impl, inputs, device, names, against_golden,
                                     references_for))
        if "layer" in checks:
            where["step"] = f"{label}: the layer check"
            rows.extend(layer_rows(spec, case, impl, device, functools.partial(_row, case, impl)))
    where["step"] = "the agreement rows"
    for a, b in itertools.combinations([i for i in impls if i.variant in results], 2):
        for name in names:
            sides = goldens[(a.variant, name)], goldens[(b.variant, name)]
            bound, floor, atol = (sum(side.get(k, math.nan) for side in sides)
                                  for k in ("bound", "floor", "atol"))
            metrics = compare_variants(results[a.variant].get(name), results[b.variant].get(name),
                                       golden[name], bound, _seq_layout(spec, name), floor, atol)
            rows.append({**_case_fields(case), "variant": f"{a.variant}~{b.variant}",
                         "impl": f"{a.impl}~{b.impl}", "check": "agreement", "tensor": name, **metrics})
    where["step"] = "the case's end (its memory freed after every check)"
    _release(device)
    return rows


def _timed_run(fn, spec, case, inputs, device, **options) -> Execution:
    """run_implementation with unwritten kernel memory poisoned, synchronised on a GPU."""
    with nan_filled_allocations():
        run = run_implementation(fn, spec, case, inputs, **options)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return run


def _inputs_row(case: Case, impl: Implementation, run: Execution) -> dict:
    """FAIL naming the first input (or initial state, or upstream gradient) the run wrote into."""
    for name, (got, original) in run.given.items():
        if not bitwise_equal(got, original):
            return _row(case, impl, "inputs", name, verdict="FAIL",
                        message=f"the kernel wrote into its input {name} "
                                f"({describe_difference(got, original)} changed)")
    return _row(case, impl, "inputs", "", verdict="PASS", message="")


def _determinism_row(spec, case, impl, inputs, device, first: dict, names) -> dict:
    """The same case run again must give bitwise the same outputs and gradients."""
    try:
        second = _timed_run(impl.fn, spec, case, inputs, device).result
    except Exception as exc:
        return _row(case, impl, "determinism", "", verdict="ERROR",
                    message=f"the second identical run raised: {describe_error(exc)}")
    for name in names:
        a, b = first.get(name), second.get(name)
        if (a is None) != (b is None) or (a is not None and not bitwise_equal(a, b)):
            detail = "present in one run only" if a is None or b is None else describe_difference(a, b)
            return _row(case, impl, "determinism", name, verdict="FAIL",
                        message=f"{name} differs between two identical runs: {detail}")
    return _row(case, impl, "determinism", "", verdict="PASS", message="")


def _segment_rows(spec, case, impl, inputs, device, names, against_golden,
                  references_for) -> list[dict]:
    """T split in segments, each taking the previous final state: every tensor against the golden,
    bounded by the baseline chained through the same segments (its rounding differs from one
    call's: a final chunk of 44 tokens instead of 1 moves fp16's ht error 40-fold)."""
    segments = segment_bounds(case.T)
    if not segments:
        return []
    where = "over segments " + " ".join(f"[{a},{b})" for a, b in segments)
    try:
        references = references_for("segments", {"segments": segments},
                                    golden=references_for("one call", {})[0])
    except Exception as exc:
        return [_row(case, impl, "segments", "", verdict="ERROR",
                     message=f"{where}: baseline failed: {describe_error(exc)}")]
    try:
        out = _timed_run(impl.fn, spec, case, inputs, device, segments=segments).result
    except Exception as exc:
        return [_row(case, impl, "segments", "", verdict="ERROR", message=f"{where}: {describe_error(exc)}")]
    rows = []
    for name in names:
        metrics = against_golden(out, name, references)
        if metrics.get("message"):
            metrics["message"] = f"{where}: {metrics['message']}"
        rows.append(_row(case, impl, "segments", name, **metrics))
    return rows


def _option_rows(spec, case, impl, inputs, device, names, against_golden, references_for) -> list[dict]:
    """Each optional-argument combination against its own golden; tensors it has no golden for
    (the final state when it is not returned, the gradient of an input passed as None) are skipped."""
    rows = []
    for label, options in option_settings(spec, case):
        try:
            references = references_for(label, options)
        except Exception as exc:
            rows.append(_row(case, impl, "options", "", verdict="ERROR",
                             message=f"with {label}: golden or baseline failed: {describe_error(exc)}"))
            continue
        try:
            out = _timed_run(impl.fn, spec, case, inputs, device, **options).result
        except Exception as exc:
            rows.append(_row(case, impl, "options", "", verdict="ERROR",
                             message=f"with {label}: {describe_error(exc)}"))
            continue
        for name in names:
            if references[0].get(name) is None:
                continue
            metrics = against_golden(out, name, references)
            if metrics.get("message"):
                metrics["message"] = f"with {label}: {metrics['message']}"
            rows.append(_row(case, impl, "options", f"{name} ({label})", **metrics))
    return rows


def _row(case: Case, impl: Implementation, check: str, tensor: str, **fields) -> dict:
    return {**_case_fields(case), "variant": impl.variant, "impl": impl.impl, "check": check,
            "tensor": tensor, **fields}


def _case_fields(case: Case) -> dict:
    return {"case_id": case.case_id, **case.as_dict()}


def run_row(case: Case, impl: Implementation, verdict: str, message: str, tensor: str = "") -> dict:
    return _row(case, impl, "run", tensor, verdict=verdict, message=message)


def describe_error(exc: BaseException) -> str:
    """One line: the exception's type and the first and last lines of its text (a RunFailed is
    already a sentence of the harness's)."""
    if isinstance(exc, RunFailed):
        return str(exc)[:500]
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if len(lines) <= 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(exc).__name__}: {text}"[:500]


def _release(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
