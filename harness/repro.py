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
import re
import string
from pathlib import Path
from types import SimpleNamespace

import torch

from harness import allocations, metrics, tolerance
from harness.cases import DTYPES, GATES, H0_OPTIONS, Case
from reports.schema import SHAPE
from harness.checks.segments import segment_bounds
from harness.registry import OpSpec, get_op, load_function
from harness.runner import DTYPE_NAMES, _seq_layout, contract_dtypes, expected_tensors
from harness.tolerance import tolerance_for

_COUNT = r"[1-9][0-9]*"
_CASE_ID = re.compile(
    rf"(?P<op>[a-z][a-z0-9_]*)-(?P<dtype>[a-z0-9]+)-B(?P<B>{_COUNT})-T(?P<T>{_COUNT})-H(?P<H>{_COUNT})"
    rf"-K(?P<K>{_COUNT})-V(?P<V>{_COUNT})(?:-M(?P<M>{_COUNT}))?-h0_(?P<h0>[a-z]+)-(?P<gate>[a-z]+)"
    rf"-s(?P<seed>0|-?{_COUNT})")
_CASE_ID_FORM = (f"OP-DTYPE-B<n>-T<n>-H<n>-K<n>-V<n>[-M<n>]-h0_<{'|'.join(H0_OPTIONS)}>-"
                 f"<{'|'.join(GATES)}>-s<seed>, e.g. rwkv6-bf16-B1-T65-H2-K16-V16-h0_grad-normal-s0")

# The harness code the script carries verbatim: the tolerance, the comparison with the golden and
# the NaN filling of kernel allocations. Each needs only math, sys, torch and the stdlib imports
# at the top of TEMPLATE.
_COPIED_TOLERANCE = (tolerance.Tolerance,)
_COPIED_METRICS = (metrics._max, metrics.first_bad_index, metrics.worst_index,
                   metrics.nonfinite_counts, metrics.compare_to_golden, metrics._name, metrics._missing,
                   metrics._bound_sentence)
_COPIED_ALLOCATIONS = (allocations.nan_filled_allocations,)


def parse_case_id(case_id: str) -> Case:
    """The Case whose `case_id` is `case_id` (the inverse of Case.case_id); ValueError if malformed.

    The op is not checked against the registry here (a Case is a plain record); write_repro does.
    """
    found = _CASE_ID.fullmatch(case_id)
    if found is None:
        raise ValueError(f"'{case_id}' is not a case id; expected {_CASE_ID_FORM}.")
    fields = found.groupdict()
    for name, allowed in (("dtype", list(DTYPES)), ("h0", list(H0_OPTIONS)), ("gate", list(GATES))):
        if fields[name] not in allowed:
            raise ValueError(f"case id '{case_id}' has {name} '{fields[name]}' where one of "
                             f"{', '.join(allowed)} was expected.")
    numbers = {k: int(fields[k]) for k in ("B", "T", "H", "K", "V", "seed")}
    return Case(op=fields["op"], dtype=fields["dtype"], h0=fields["h0"], gate=fields["gate"],
                M=int(fields["M"] or 0), **numbers)


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
    _check_slots(spec, case)
    target = target or spec.variants[variant]
    load_function(target)
    if segments and not segment_bounds(case.T):
        raise ValueError(f"case '{case_id}' has T={case.T}, too short to cut into segments.")
    if device is not None:
        _check_device(device)
    path = Path(path)
    if path.is_dir():
        path = path / script_name(case_id, variant, segments)
    text = render_script(spec, case, variant, target, segments, device, path.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _check_slots(spec: OpSpec, case: Case):
    """Ops with slots (gsa) need M in the id; the others must not have one."""
    if spec.uses_slots and not case.M:
        raise ValueError(f"case '{case.case_id}' has no -M<n>, which op {spec.name} (with slots) needs.")
    if case.M and not spec.uses_slots:
        raise ValueError(f"case '{case.case_id}' has M={case.M}, but op {spec.name} has no slots.")


def _check_device(device: str):
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
        "under_test": under_test,
        "imports": _imports(spec, target),
        "case_id_literal": _literal(case.case_id), "target_literal": _literal(target),
        "op": _literal(case.op), "dtype_literal": _literal(case.dtype), "torch_dtype": str(case.torch_dtype),
        "dims": ", ".join(str(getattr(case, d)) for d in SHAPE),
        "h0": _literal(case.h0), "gate": _literal(case.gate), "gate_divisor": repr(GATES[case.gate]),
        "seed": repr(case.seed), "segments": repr(cuts),
        "device": _literal(device) if device else '"cuda" if torch.cuda.is_available() else "cpu"',
        "loop_max_T": spec.loop_max_T, "baseline_chunk": spec.baseline_chunk_size,
        "inputs": "\n".join(f"    ({_literal(s.name)}, {_shape(s.shape)}, {_literal(s.kind)}),"
                            for s in spec.inputs),
        "states": "\n".join(f"    ({_literal(s.name)}, {_shape(s.shape)})," for s in spec.states),
        "sequence_inputs": _names([s.name for s in spec.inputs if tuple(s.shape[:2]) == ("B", "T")]),
        "tolerance_source": _sources(_COPIED_TOLERANCE),
        "metrics_source": _sources(_COPIED_METRICS),
        "allocations_source": _sources(_COPIED_ALLOCATIONS),
        **_tensor_tables(spec, case),
    }
    text = string.Template(TEMPLATE).substitute(fields)
    compile(text, filename, "exec")
    return text


def _segments_note(cuts) -> str:
    """The docstring's paragraph on segments, empty for one call."""
    if not cuts:
        return ""
    spans = " ".join(f"[{a},{b})" for a, b in cuts)
    return (f"\nThe function runs over the segments {spans} of the T steps: each call starts from the\n"
            f"previous call's final state, and backward runs through the chain (SEGMENTS below).\n")


def _imports(spec: OpSpec, target: str) -> str:
    """The function under test and the two references, each under the fixed name the script uses."""
    imports = (("function_under_test", target, "the function under test"),
               ("reference_loop", spec.reference_loop, "float64 recurrent loop: the op's definition"),
               ("reference_chunked", spec.reference_chunked, "the same in chunks: long T, and the baseline"))
    return "\n".join(f"from {name.replace(':', ' import ')} as {alias}  # {note}"
                     for alias, name, note in imports)


def _shape(symbols) -> str:
    """('B', 'T', 'H', 'K') -> '(B, T, H, K)', the script's dimension constants."""
    return "(" + ", ".join(symbols) + ("," if len(symbols) == 1 else "") + ")"


def _literal(text: str) -> str:
    """A string as a double-quoted Python literal."""
    return json.dumps(text)


def _names(names) -> str:
    return "{" + ", ".join(map(_literal, names)) + "}" if names else "set()"


def _tensor_tables(spec: OpSpec, case: Case) -> dict:
    """Per tensor of the case: the dtype it must come back in, its tolerance, its layout."""
    names = expected_tensors(spec, case)
    drawn = SimpleNamespace(tensors={s.name: torch.empty(0, dtype=case.torch_dtype) for s in spec.inputs})
    dtypes = contract_dtypes(spec, case, drawn)
    rows = {name: tolerance_for(case.op, name, case.dtype, case.T, DTYPE_NAMES[dtypes[name]])
            for name in names}
    return {
        "tensors": "[" + ", ".join(map(_literal, names)) + "]",
        "expected_dtypes": "\n".join(f"    {_literal(n)}: {dtypes[n]}," for n in names),
        "tolerances": "\n".join(f"    {_literal(n)}: {rows[n]!r}," for n in names),
        "sequence_tensors": _names([n for n in names if _seq_layout(spec, n)]),
    }


def _sources(objects) -> str:
    return "\n\n\n".join(inspect.getsource(obj).strip() for obj in objects)


TEMPLATE = '''\
"""Reproduces harness case $case_id$what.

Function under test: $under_test.
$segments_note
The script stands alone (no harness import). It draws the case's inputs exactly as the harness
does, bit for bit, runs forward and backward of the function under test, computes the float64
golden (the op's reference loop, its chunked form beyond LOOP_MAX_T steps, on the inputs upcast
exactly) and the same-dtype baseline (the chunked reference with its matrix-product operands in
$dtype, as a straightforward kernel would compute it), and prints one line per output and
gradient: the numbers a sweep reports for it.

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

import functools
import math
import os
import sys
import zlib
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    # Without a GPU, Triton kernels run in its CPU interpreter; the switch precedes their import.
    os.environ.setdefault("TRITON_INTERPRET", "1")

$imports

# The case ---------------------------------------------------------------------------------------
CASE_ID = $case_id_literal
TARGET = $target_literal  # the function under test, as module:function
OP = $op
DTYPE = $dtype_literal
TORCH_DTYPE = $torch_dtype
B, T, H, K, V, M = $dims  # batch, steps, heads, key and value head dims, slots (gsa)
H0 = $h0  # initial state: "none", "random" (given) or "grad" (given, its gradient checked)
GATE = $gate  # gate strength: a gate is logsigmoid(randn) / GATE_DIVISOR, a log decay <= 0
GATE_DIVISOR = $gate_divisor
SEED = $seed
SCALE = K ** -0.5
DEVICE = $device
SEGMENTS = $segments  # None: one call; else the (start, end) steps of each chained call
LOOP_MAX_T = $loop_max_T  # the golden comes from reference_loop up to this T, reference_chunked beyond
BASELINE_CHUNK_SIZE = $baseline_chunk  # the chunk of production kernels

# The inputs in the function's positional order: name, shape, how it is drawn ("gate": a log decay).
INPUTS = [
$inputs
]
# The recurrent state(s), [name, shape]: passed and returned as a tensor, as a tuple when several.
STATES = [
$states
]
SEQUENCE_INPUTS = $sequence_inputs  # the inputs with a time axis, which SEGMENTS cut


# Inputs -----------------------------------------------------------------------------------------
@dataclass
class Inputs:
    tensors: dict          # name -> tensor in TORCH_DTYPE, in the function's positional order
    initial_states: tuple  # float32, one per state; None when H0 == "none"
    do: torch.Tensor       # the upstream gradient of o (TORCH_DTYPE)
    dhts: tuple            # the upstream gradients of the final states (float32)


def make_generator() -> torch.Generator:
    """A CPU generator seeded from the case, so the inputs are the same on every device."""
    key = f"{SEED}-{B}-{T}-{H}-{K}-{V}-{M}-{DTYPE}-{GATE}"
    return torch.Generator().manual_seed(zlib.crc32(key.encode()))


def make_inputs(device=DEVICE) -> Inputs:
    """Every input drawn in float32 on the CPU in a fixed order, rounded to TORCH_DTYPE, moved to
    `device`: the inputs, the initial states (unless H0 is "none"), do, then the dhts."""
    gen = make_generator()

    def draw(shape, kind="randn"):
        x = torch.randn(shape, generator=gen, dtype=torch.float32)
        if kind == "gate":
            x = F.logsigmoid(x) / GATE_DIVISOR
        return x.to(TORCH_DTYPE).to(device)

    def draw_states():
        return tuple(torch.randn(shape, generator=gen, dtype=torch.float32).to(device)
                     for _, shape in STATES)

    tensors = {name: draw(shape, kind) for name, shape, kind in INPUTS}
    initial_states = None if H0 == "none" else draw_states()
    do = draw((B, T, H, V))
    return Inputs(tensors, initial_states, do, draw_states())


# Forward and backward ---------------------------------------------------------------------------
def run(fn, inputs: Inputs, to_dtype=None, segments=None) -> dict:
    """Forward and backward of `fn` as the harness runs every implementation.

    Each input is a fresh copy (cast to `to_dtype` if given) requiring grad; the initial state
    requires grad when H0 == "grad". The call asks for the final state; with `segments` each call
    takes the previous one's final state and backward runs through the chain. The loss is
    sum(o * do) + sum(final state * dht). Returns {name: tensor}: "o", the final states
    ("ht"; gsa "hkt", "hvt"), the gradients of the inputs ("d" + name) and, when H0 == "grad",
    of the initial states ("dh0"; gsa "dhk0", "dhv0"); None where the function gave none.
    """
    def leaf(x, grad=True):
        x = x.detach().clone() if to_dtype is None else x.detach().to(to_dtype)
        return x.requires_grad_(grad)

    leaves = {name: leaf(x) for name, x in inputs.tensors.items()}
    h0 = None
    if inputs.initial_states is not None:
        h0 = tuple(leaf(x, grad=H0 == "grad") for x in inputs.initial_states)
    o, finals = forward(fn, leaves, h0, segments or [(0, T)])
    do = leaf(inputs.do, grad=False)
    outputs, grads = [o], [do]
    for final, dht in zip(finals, inputs.dhts):
        if final is not None:
            outputs.append(final)
            grads.append(leaf(dht, grad=False))
    torch.autograd.backward(outputs, grads)
    result = {"o": o.detach()}
    for (name, _), final in zip(STATES, finals):
        result[name + "t"] = None if final is None else final.detach()
    for name, x in leaves.items():
        result["d" + name] = x.grad
    if H0 == "grad":
        for (name, _), x in zip(STATES, h0):
            result["d" + name + "0"] = x.grad
    return result


def forward(fn, leaves: dict, h0, segments) -> tuple:
    """o over all of T and the final states (a tuple, one per state), one call per segment."""
    single = len(STATES) == 1
    pieces, finals = [], h0
    for t0, t1 in segments:
        args = [x[:, t0:t1] if name in SEQUENCE_INPUTS else x for name, x in leaves.items()]
        state = None if finals is None else (finals[0] if single else finals)
        o, finals = fn(*args, scale=SCALE, initial_state=state, output_final_state=True)
        pieces.append(o)
        finals = (finals,) if single else finals
    o = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
    return o, ((None,) * len(STATES) if finals is None else finals)


def golden_and_baseline(inputs: Inputs) -> tuple[dict, dict]:
    """The float64 golden of one call, and the same-dtype baseline (chained through SEGMENTS when
    set: where a sequence is cut changes the rounding of the baseline, not the float64 truth)."""
    golden_fn = reference_loop if T <= LOOP_MAX_T else reference_chunked
    golden = run(golden_fn, inputs, to_dtype=torch.float64)
    baseline_fn = functools.partial(reference_chunked, operand_dtype=TORCH_DTYPE,
                                    chunk_size=BASELINE_CHUNK_SIZE)
    return golden, run(baseline_fn, inputs, segments=SEGMENTS)


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


$metrics_source


def compare(results: dict, golden: dict, baseline: dict) -> dict:
    """{tensor: its metrics against the golden (err, base_err, floor, bound, ratio, nan, inf,
    first_bad, verdict, message)}."""
    return {name: compare_to_golden(results.get(name), golden[name], baseline[name], TOLERANCES[name],
                                    name in SEQUENCE_TENSORS, EXPECTED_DTYPES[name])
            for name in TENSORS}


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
    golden = "reference_loop" if T <= LOOP_MAX_T else "reference_chunked"
    print(f"case {CASE_ID}, {how}, on {DEVICE}\\nfunction under test: {TARGET}")
    print(f"golden: {golden} in float64; baseline: reference_chunked with {DTYPE} operands, "
          f"chunks of {BASELINE_CHUNK_SIZE}\\n")


if __name__ == "__main__":
    print_case()
    inputs = make_inputs()
    golden, baseline = golden_and_baseline(inputs)
    with nan_filled_allocations():
        results = run(function_under_test, inputs, segments=SEGMENTS)
    metrics = compare(results, golden, baseline)
    print_table(metrics)
    failed = [name for name, m in metrics.items() if m["verdict"] != "PASS"]
    print(f"\\n{'FAIL: ' + ', '.join(failed) if failed else 'PASS'} "
          f"({len(metrics) - len(failed)} of {len(metrics)} tensors within their bounds)")
    if not sys.flags.interactive:  # python -i: stay at the prompt instead
        sys.exit(1 if failed else 0)
'''
