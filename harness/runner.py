"""Run one case: golden, baseline, every implementation, and turn the results into rows."""
from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from harness.cases import DTYPES, Case
from harness.inputs import CaseInputs, make_inputs
from harness.metrics import compare_to_golden, compare_variants
from harness.registry import OpSpec, load_function
from harness.tolerance import tolerance_for


DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


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


def execute(fn, spec: OpSpec, case: Case, inputs: CaseInputs, to_dtype=None) -> dict:
    """Forward and backward with the shared upstream gradients; returns every output and gradient.

    Inputs are cloned first (optionally cast to `to_dtype`), so no implementation sees another's
    tensors. An op with one state takes and returns it as a tensor, with several as tuples.
    """
    def leaf(x, grad=True):
        x = x.detach().clone() if to_dtype is None else x.detach().to(to_dtype)
        return x.requires_grad_(grad)

    def cast(x):
        return x if to_dtype is None else x.to(to_dtype)

    single = len(spec.states) == 1
    leaves = {name: leaf(x) for name, x in inputs.tensors.items()}
    h0 = None
    if inputs.initial_states is not None:
        h0 = tuple(leaf(x, grad=case.h0 == "grad") for x in inputs.initial_states)
    o, finals = fn(*leaves.values(), scale=inputs.scale, initial_state=h0[0] if single and h0 else h0,
                   output_final_state=True)
    if single:
        finals = (finals,)
    elif finals is None:
        finals = (None,) * len(spec.states)
    outputs, grads = [o], [cast(inputs.do)]
    for final, dht in zip(finals, inputs.dhts):
        if final is not None:
            outputs.append(final)
            grads.append(cast(dht))
    torch.autograd.backward(outputs, grads)
    result = {"o": o.detach()}
    for name, final in zip(spec.final_state_names(), finals):
        result[name] = None if final is None else final.detach()
    for name, x in leaves.items():
        result["d" + name] = x.grad
    if case.h0 == "grad":
        for name, x in zip(spec.initial_state_grad_names(), h0):
            result[name] = x.grad
    return result


def golden_and_baseline(spec: OpSpec, case: Case, inputs: CaseInputs) -> tuple[dict, dict]:
    """The float64 golden (loop for short T, chunked form beyond) and the same-dtype baseline."""
    loop = load_function(spec.reference_loop)
    chunked = load_function(spec.reference_chunked)
    golden_fn = loop if case.T <= spec.loop_max_T else chunked
    golden = execute(golden_fn, spec, case, inputs, to_dtype=torch.float64)
    baseline_fn = functools.partial(chunked, operand_dtype=case.torch_dtype,
                                    chunk_size=spec.baseline_chunk_size)
    baseline = execute(baseline_fn, spec, case, inputs)
    return golden, baseline


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


def run_case(spec: OpSpec, case: Case, impls: list[Implementation], device) -> list[dict]:
    """Every row of one case. An implementation that raises becomes an ERROR row; nothing else stops."""
    rows = []
    try:
        inputs = make_inputs(spec, case, device)
        golden, baseline = golden_and_baseline(spec, case, inputs)
    except Exception as exc:  # the references failing is reported, not fatal
        return [_run_row(case, impl, "ERROR", f"golden or baseline failed: {_describe(exc)}")
                for impl in impls]
    names = expected_tensors(spec, case)
    dtypes = contract_dtypes(spec, case, inputs)
    results, bounds = {}, {}
    for impl in impls:
        start = time.perf_counter()
        try:
            out = execute(impl.fn, spec, case, inputs)
            if device.type == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:
            rows.append(_run_row(case, impl, "ERROR", _describe(exc)))
            _release(device)
            continue
        wall = time.perf_counter() - start
        results[impl.variant] = out
        for name in names:
            tol = tolerance_for(case.op, name, case.dtype, case.T, DTYPE_NAMES[dtypes[name]])
            metrics = compare_to_golden(out.get(name), golden[name], baseline[name], tol,
                                        _seq_layout(spec, name), dtypes[name])
            bounds[(impl.variant, name)] = metrics.get("bound", math.nan)
            rows.append({**_case_fields(case), "variant": impl.variant, "impl": impl.impl,
                         "check": "golden", "tensor": name, "wall_s": wall, **metrics})
    for a, b in itertools.combinations([i for i in impls if i.variant in results], 2):
        for name in names:
            bound = bounds[(a.variant, name)] + bounds[(b.variant, name)]
            metrics = compare_variants(results[a.variant].get(name), results[b.variant].get(name),
                                       golden[name], bound, _seq_layout(spec, name))
            rows.append({**_case_fields(case), "variant": f"{a.variant}~{b.variant}",
                         "impl": f"{a.impl}~{b.impl}", "check": "agreement", "tensor": name, **metrics})
    _release(device)
    return rows


def _case_fields(case: Case) -> dict:
    return {"case_id": case.case_id, **case.as_dict()}


def _run_row(case: Case, impl: Implementation, verdict: str, message: str) -> dict:
    return {**_case_fields(case), "variant": impl.variant, "impl": impl.impl, "check": "run",
            "tensor": "", "verdict": verdict, "message": message}


def _describe(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if len(lines) <= 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(exc).__name__}: {text}"[:500]


def _release(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
