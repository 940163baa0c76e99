"""`python -m harness repro CASE_ID`: one case of a sweep as a standalone Python script.

A kernel author debugging a failed row wants the case without the harness around it: the same
inputs, bit for bit, the same call of the function under test, the same float64 golden and
same-dtype baseline, and the same numbers per tensor. `write_repro` writes that script from
TEMPLATE: the case's numbers, input shapes and tolerances become literals, and the comparison code
is the harness's own (`harness/metrics.py`, `tolerance.py`, `allocations.py`), copied in with
`inspect.getsource`, so the script's err, bound and verdict are the sweep's row for the case.
"""
from __future__ import annotations

import inspect
import json
import pprint
import re
import string
from pathlib import Path
from types import SimpleNamespace

import torch

from harness import (allocations, cases, declaration, execution, goldens, inputs, interpreted_upstream, metrics,
                     packing, sampling, sweep, tolerance)
from harness.cases import (DTYPE_CHOICES, DTYPE_NAMES, EXTREME_GATE, GATES, H0_OPTIONS, MIXED_DTYPES,
                           OWN_SYMBOLS, Case)
from reports.schema import SHAPE
from harness.checks.segments import segment_bounds
from harness.declaration import GATE_KINDS, OpSpec, load_function
from harness.inputs import packed_lengths
from harness.registry import get_op
from harness.runner import _seq_layout, contract_dtypes, expected_tensors
from harness.tolerance import tolerance_for

_COUNT = r"[1-9][0-9]*"
_CASE_ID = re.compile(
    rf"(?P<op>[a-z][a-z0-9_]*)-(?P<dtype>[a-z0-9]+(?:-fp32gates)?)-B(?P<B>{_COUNT})-T(?P<T>{_COUNT})-H(?P<H>{_COUNT})"
    rf"-K(?P<K>{_COUNT})-V(?P<V>{_COUNT})"
    + "".join(rf"(?:-{s}(?P<{s}>{_COUNT}))?" for s in OWN_SYMBOLS)
    + rf"-h0_(?P<h0>[a-z]+)-(?P<gate>[a-z]+)"
    rf"-s(?P<seed>0|-?{_COUNT})(?:-(?P<varlen>packed))?(?:-(?P<option>[A-Za-z_][A-Za-z0-9_=]*))?")
_CASE_ID_FORM = (f"OP-DTYPE-B<n>-T<n>-H<n>-K<n>-V<n>{''.join(f'[-{s}<n>]' for s in OWN_SYMBOLS)}-h0_<{'|'.join(H0_OPTIONS)}>-"
                 f"<{'|'.join(GATES)}>-s<seed>[-packed][-<option>], e.g. rwkv6-bf16-B1-T65-H2-K16-V16-h0_grad-normal-s0")

# The harness code the script carries verbatim: the tolerance, the comparison with the golden and
# the NaN filling of kernel allocations. Each needs only math, sys, torch and the stdlib imports
# at the top of TEMPLATE.
COPIED_TOLERANCE = (tolerance.Tolerance,)
COPIED_METRICS = (metrics._max, metrics.half_ulp, metrics.first_bad_index, metrics.worst_index,
                   metrics.nonfinite_counts, metrics._baseline_error, metrics._at_least_their_spread,
                   metrics.compare_to_golden,
                   metrics._name, metrics._missing, metrics._bound_sentence)
_COPIED_ALLOCATIONS = (allocations.nan_filled_allocations,)
# What lets an upstream kernel run in the interpreter without a GPU; copied for targets not ours.
_COPIED_INTERPRETED = (interpreted_upstream.needed, interpreted_upstream.prepare, interpreted_upstream._untimed)
# The case core: the declaration's types, the case, drawing the inputs, running an implementation
# forward and backward, and the golden and baseline; the script builds SPEC and CASE from them.
_COPIED_CORE = (declaration.InputSpec, declaration.StateSpec, declaration.OptionSpec, declaration.Symbol,
                declaration.LayerSpec, declaration.OpSpec, declaration.load_function, cases.Case,
                packing.sequence_count, packing.sequence_lengths, packing._draw, packing.cu_seqlens_of, packing.per_sequence,
                inputs.CaseInputs, inputs._generator, inputs.of_kind, inputs.packed_lengths, inputs.make_inputs, execution.Execution, execution.RunFailed,
                execution._shape_text, execution.returned_problems, execution.run_implementation,
                execution.execute, execution.describe_error, sweep.device_healthy,
                goldens.baseline_function, goldens.golden_and_baseline, sampling.Sample, sampling.reference_states, sampling.choose_sample)


def parse_case_id(case_id: str) -> Case:
    """The Case whose `case_id` is `case_id` (the inverse of Case.case_id); ValueError if malformed.

    The op is not checked against the registry here (a Case is a plain record); write_repro does.
    """
    found = _CASE_ID.fullmatch(case_id)
    if found is None:
        raise ValueError(f"'{case_id}' is not a case id; expected {_CASE_ID_FORM}.")
    fields = found.groupdict()
    for name, allowed in (("dtype", list(DTYPE_CHOICES)), ("h0", list(H0_OPTIONS)), ("gate", list(GATES))):
        if fields[name] not in allowed:
            raise ValueError(f"case id '{case_id}' has {name} '{fields[name]}' where one of "
                             f"{', '.join(allowed)} was expected.")
    numbers = {k: int(fields[k] or 0) for k in (*SHAPE, "seed")}
    return Case(op=fields["op"], dtype=fields["dtype"], h0=fields["h0"], gate=fields["gate"],
                varlen=fields["varlen"] or "none", option=fields["option"] or "none", **numbers)


def script_name(case_id: str, variant: str, segments: bool = False) -> str:
    """The file name write_repro gives a script when it is handed a folder."""
    return f"repro_{case_id}_{variant}{'_segments' if segments else ''}.py"


def write_repro(case_id: str, path, variant: str | None = None, target: str | None = None,
                segments: bool = False, device: str | None = None) -> Path:
    """Write the standalone script reproducing `case_id` to `path` and return its path.

    `path` may be an existing folder (the script is then named by script_name). `variant`: one of
    the op's variants (default its first); `target` ("module:function") runs in the variant's place,
    as the sweep's `--impl VARIANT=module:function`; `segments` reproduces the segments check
    instead of one call; `device` fixes the device (default: cuda when available, else cpu).
    Everything is validated, with ValueError, before anything is written.
    """
    case = parse_case_id(case_id)
    spec = get_op(case.op)
    variant = variant or next(iter(spec.variants))
    if variant not in spec.variants:
        raise ValueError(f"op {spec.name} has no variant '{variant}'; its variants are "
                         f"{', '.join(spec.variants)}.")
    check_own_symbols(spec, case)
    target = target or spec.variants[variant]
    load_function(target)
    if segments and case.packed:
        raise ValueError(f"case '{case_id}' is packed; its sequences are not cut into segments.")
    if segments and not segment_bounds(case.T):
        raise ValueError(f"case '{case_id}' has T={case.T}, too short to cut into segments.")
    if device is not None:
        check_device(device)
    path = Path(path)
    if path.is_dir():
        path = path / script_name(case_id, variant, segments)
    text = render_script(spec, case, variant, target, segments, device, path.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def check_own_symbols(spec: OpSpec, case: Case):
    """An op's own symbols (gsa's M) must be in the id; other ops' must not."""
    for symbol in OWN_SYMBOLS:
        if symbol in spec.used_symbols() and not getattr(case, symbol):
            raise ValueError(f"case '{case.case_id}' has no -{symbol}<n>, which op {spec.name} "
                             f"({spec.symbols[symbol].meaning}) needs.")
        if getattr(case, symbol) and symbol not in spec.used_symbols():
            raise ValueError(f"case '{case.case_id}' has {symbol}={getattr(case, symbol)}, but op "
                             f"{spec.name} has no {symbol}.")


def check_device(device: str):
    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"'{device}' is not a torch device.") from None


def render_script(spec: OpSpec, case: Case, variant: str, target: str, segments: bool,
                  device: str | None, filename: str) -> str:
    """The script's text: TEMPLATE filled with the case's literals and the copied harness code."""
    cuts = segment_bounds(case.T) if segments else None
    ours = spec.variants[variant]
    under_test = (f"{target} (variant {variant})" if target == ours
                  else f"{target}, in place of variant {variant} ({ours})")
    fields = {
        "case_id": case.case_id, "filename": filename, "dtype": case.dtype,
        "what": ", segments check" if cuts else "", "segments_note": _segments_note(cuts),
        "under_test": under_test, "target": target.replace(":", " import "),
        "target_literal": literal(target), "segments": repr(cuts),
        "device": literal(device) if device else '"cuda" if torch.cuda.is_available() else "cpu"',
        "spec": pprint.pformat(spec, width=100), "case": pprint.pformat(case, width=100),
        "constants": constants_text(),
        "core_source": sources(_COPIED_CORE),
        "tolerance_source": sources(COPIED_TOLERANCE),
        "metrics_source": sources(COPIED_METRICS),
        "allocations_source": sources(_COPIED_ALLOCATIONS),
        "interpreted_source": "" if target.startswith("fla_kernels.") else interpreted_text(),
        **_tensor_tables(spec, case),
    }
    text = string.Template(TEMPLATE).substitute(fields)
    compile(text, filename, "exec")
    return text


def constants_text(**more) -> str:
    """The harness constants the copied code reads, and `more`, as assignments."""
    constants = dict(
        DTYPES=cases.DTYPES, MIXED_DTYPES=MIXED_DTYPES, SHAPE=SHAPE, CORE_SYMBOLS=declaration.CORE_SYMBOLS,
        CHUNK=packing.CHUNK, OWN_SYMBOLS=OWN_SYMBOLS, GATES=GATES, EXTREME_GATE=EXTREME_GATE,
        GATE_KINDS=declaration.GATE_KINDS,
        GOLDEN_LIMIT=sampling.GOLDEN_LIMIT, STATE_LIMIT=sampling.STATE_LIMIT,
        FEW_ELEMENTS=metrics.FEW_ELEMENTS, CHANCE_SIGMAS=metrics.CHANCE_SIGMAS, **more)
    return "\n".join(f"{name} = {value!r}" for name, value in constants.items())


def interpreted_text() -> str:
    """What lets an upstream kernel run in the interpreter without a GPU, as the script's code."""
    return ("\n# Upstream's autotuned, device-guarded calls in the interpreter (harness/interpreted_upstream.py)\n"
            "import contextlib  # noqa: E402\n\n\n" + sources(_COPIED_INTERPRETED) + "\n\nprepare()\n")


def _segments_note(cuts) -> str:
    """The docstring's paragraph on segments, empty for one call."""
    if not cuts:
        return ""
    spans = " ".join(f"[{a},{b})" for a, b in cuts)
    return (f"\nThe function runs over the segments {spans} of the T steps: each call starts from the\n"
            f"previous call's final state, and backward runs through the chain (SEGMENTS below).\n")


def literal(text: str) -> str:
    """A string as a double-quoted Python literal."""
    return json.dumps(text)


def _names(names) -> str:
    return "{" + ", ".join(map(literal, names)) + "}" if names else "set()"


def _tensor_tables(spec: OpSpec, case: Case) -> dict:
    """Per tensor of the case: the dtype it must come back in, its tolerance, its layout and
    symbolic shape."""
    spec = spec.under(case.option)
    names = expected_tensors(spec, case)
    drawn = SimpleNamespace(tensors={s.name: torch.empty(0, dtype=case.gate_dtype if s.kind in GATE_KINDS else
                                                         case.torch_dtype) for s in spec.inputs})
    dtypes = contract_dtypes(spec, case, drawn)
    longest = max(packed_lengths(case)) if case.packed else case.T
    rows = {name: tolerance_for(case.op, name, case.activation_dtype, longest, DTYPE_NAMES[dtypes[name]])
            for name in names}
    return {
        "tensors": "[" + ", ".join(map(literal, names)) + "]",
        "expected_dtypes": "\n".join(f"    {literal(n)}: {dtypes[n]}," for n in names),
        "tolerances": "\n".join(f"    {literal(n)}: {rows[n]!r}," for n in names),
        "sequence_tensors": _names([n for n in names if _seq_layout(spec, n)]),
        "shapes": "{" + ", ".join(f"{literal(n)}: {spec.tensor_shapes()[n]!r}" for n in names) + "}",
    }


def sources(objects) -> str:
    return "\n\n\n".join(inspect.getsource(obj).strip() for obj in objects)


TEMPLATE = '''\
"""Reproduces harness case $case_id$what.

Function under test: $under_test.
$segments_note
The script stands alone (no harness import). It draws the case's inputs exactly as the harness
does, bit for bit, runs forward and backward of the function under test (first, so that a call
that raises shows before the golden takes its memory), computes the float64 golden (the op's
reference loop, its chunked form beyond SPEC.loop_max_T steps, on the inputs upcast exactly) and
the same-dtype baseline (the chunked reference with its matrix-product operands in
$dtype, as a straightforward kernel would compute it), and prints one line per output and
gradient: the numbers a sweep reports for it. A case too large for a whole float64 golden (more
than GOLDEN_LIMIT elements in an input, or STATE_LIMIT in the references' states) is compared on
the sweep's sample: the first, the last and one drawn batch row (or packed sequence) at the
last head.

Run it where fla_kernels and references import (the repository root, or after pip install -e .):

    python $filename
        one line per output and gradient; exit status 0 if all pass, 1 if any fails
    python -i $filename
        the same, then a prompt to inspect results, golden and baseline (dicts of tensors
        by name), inputs and metrics

Columns, per tensor X, with X64 its golden and Xb its baseline:
    err           max|X - X64|
    baseline err  max|Xb - X64|: what computing in the case's dtype costs anyway
    floor         max|X64.to(dtype) - X64|: the rounding of the golden itself into the dtype X
                  must be returned in (EXPECTED_DTYPES)
    bound         factor * baseline err + floor_factor * floor + atol (TOLERANCES)
    NaN, Inf      counts, and the first bad (b, t, h) where the golden is finite
    verdict       PASS if err <= bound and no NaN/Inf where the golden is finite, else FAIL
                  (ERROR: the baseline itself is not finite, so there is no bound)
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import os
import sys
import time
import zlib
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    # Without a GPU, Triton kernels run in its CPU interpreter; the switch precedes their import.
    os.environ.setdefault("TRITON_INTERPRET", "1")
$interpreted_source
from $target as function_under_test  # noqa: E402


# The case ---------------------------------------------------------------------------------------
TARGET = $target_literal  # the function under test, as module:function
DEVICE = $device
SEGMENTS = $segments  # None: one call; else the (start, end) steps of each chained call
$constants


# The case core: the harness's own code, copied verbatim. The op's declaration (SPEC) and the
# case (CASE) below say what is drawn and run; make_inputs draws the inputs exactly as the
# harness does, bit for bit; run_implementation runs forward and backward; golden_and_baseline
# gives the float64 golden (the op's reference loop, its chunked form beyond SPEC.loop_max_T
# steps) and the same-dtype baseline (the chunked reference with its products' operands in the
# case's dtype, in chunks of SPEC.baseline_chunk_size).
$core_source


SPEC = $spec
CASE = $case


def run(fn, inputs: CaseInputs, to_dtype=None, segments=None) -> dict:
    """Every output and gradient of one forward and backward of `fn`, as the sweep runs it."""
    return execute(fn, SPEC, CASE, inputs, to_dtype, segments=segments)


def golden_and_baseline_of_case(inputs: CaseInputs) -> tuple[dict, dict]:
    """The golden of one call, and the baseline chained through SEGMENTS when set (where a
    sequence is cut changes the rounding of the baseline, not the float64 truth)."""
    golden, baseline = golden_and_baseline(SPEC, CASE, inputs)
    if SEGMENTS:
        baseline = golden_and_baseline(SPEC, CASE, inputs, golden=golden, segments=SEGMENTS)[1]
    return golden, baseline


# While the function under test runs, memory that code in fla_kernels allocates with torch.empty
# is filled with NaN (the harness's code), so output a kernel forgot to write shows as NaN.
$allocations_source


# Comparison with the golden ---------------------------------------------------------------------
# The tolerance and compare_to_golden are the harness's code, so the numbers are a sweep's.
$tolerance_source


TENSORS = $tensors
# The dtype each tensor must come back in: o and the inputs' gradients in TORCH_DTYPE, states float32.
EXPECTED_DTYPES = {
$expected_dtypes
}
TOLERANCES = {
$tolerances
}
SEQUENCE_TENSORS = $sequence_tensors  # [B, T, H, ...] tensors: a NaN/Inf is located as (b, t, h)
SHAPES = $shapes


$metrics_source


def compare(results: dict, golden: dict, baseline: dict, names) -> dict:
    """{tensor: its metrics against the golden (err, base_err, floor, bound, ratio, nan, inf,
    first_bad, verdict, message)} for each of `names`."""
    return {name: compare_to_golden(results.get(name), golden[name], baseline[name], TOLERANCES[name],
                                    name in SEQUENCE_TENSORS, EXPECTED_DTYPES[name])
            for name in names}


# Report -----------------------------------------------------------------------------------------
COLUMNS = [  # metrics key, title, width, format
    ("err", "err", 11, ".3e"), ("base_err", "baseline err", 14, ".3e"), ("floor", "floor", 11, ".3e"),
    ("bound", "bound", 11, ".3e"), ("ratio", "err/bound", 11, ".3g"), ("nan", "NaN", 6, "d"),
    ("inf", "Inf", 6, "d"),
]


def cell(value, width: int, form: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{form}}"


def print_table(metrics: dict):
    """One aligned line per tensor, then the reason for each one that did not pass."""
    print(f"{'tensor':<8}" + "".join(f"{title:>{width}}" for _, title, width, _ in COLUMNS)
          + f"  {'first bad':<20}verdict")
    for name, m in metrics.items():
        print(f"{name:<8}" + "".join(cell(m.get(key), width, form) for key, _, width, form in COLUMNS)
              + f"  {m.get('first_bad') or '-':<20}{m['verdict']}")
    reasons = [f"{name}: {m['message']}" for name, m in metrics.items() if m.get("message")]
    if reasons:
        print("\\n" + "\\n".join(reasons))


def print_case():
    """What runs: the case, the function, the device, and where golden and baseline come from."""
    how = "one call" if SEGMENTS is None else "segments " + " ".join(f"[{a},{b})" for a, b in SEGMENTS)
    golden = SPEC.reference_loop if CASE.T <= SPEC.loop_max_T else SPEC.reference_chunked
    print(f"case {CASE.case_id}, {how}, on {DEVICE}\\nfunction under test: {TARGET}")
    print(f"golden: {golden} in float64; baseline: {SPEC.reference_chunked} with {CASE.dtype} "
          f"operands, chunks of {SPEC.baseline_chunk_size}\\n")


def main() -> int:
    """Run the case and print its table; 0 if every tensor passes, else 1. Its inputs, results,
    golden, baseline and metrics stay in the module (python -i)."""
    global inputs, results, golden, baseline, metrics
    print_case()
    inputs = make_inputs(SPEC, CASE, DEVICE)
    try:
        with nan_filled_allocations("fla_kernels", TARGET.split(".")[0].split(":")[0]):
            results = run(function_under_test, inputs, segments=SEGMENTS)
    except Exception as exc:   # the sweep's ERROR row; the outputs it returned are still compared
        print(f"ERROR: {describe_error(exc)}\\n")
        results = getattr(exc, "forward", None) or {}
        if not device_healthy(torch.device(DEVICE)):
            print("The GPU context is lost: a kernel's illegal or misaligned memory access is sticky, so every "
                  "later CUDA call in this process fails and no golden can run here.")
            return 1
        if not results:
            return 1
    names = TENSORS
    sample = choose_sample(SPEC, CASE, inputs)
    if sample is not None:
        names = [name for name in TENSORS if Sample.covers(SHAPES[name])]
        print(f"golden on a sample: {sample.describe(CASE.packed)} (too large for a whole float64 "
              f"golden); no golden for {', '.join(sorted(set(TENSORS) - set(names))) or 'none'}\\n")
        inputs = sample.inputs(SPEC, inputs)
        results = {name: sample.take(SHAPES[name], x) for name, x in results.items() if name in SHAPES}
    golden, baseline = golden_and_baseline_of_case(inputs)
    metrics = compare(results, golden, baseline, names)
    print_table(metrics)
    failed = [name for name, m in metrics.items() if m["verdict"] != "PASS"]
    print(f"\\n{'FAIL: ' + ', '.join(failed) if failed else 'PASS'} "
          f"({len(metrics) - len(failed)} of {len(metrics)} tensors within their bounds)")
    return 1 if failed else 0


if __name__ == "__main__":
    status = main()
    if not sys.flags.interactive:  # python -i: stay at the prompt instead
        sys.exit(status)
'''
