"""`python -m harness repro CASE_ID --layer SET`: the layer check of an implementation set's own
layer (fla's GatedLinearAttention, DeltaNet...) for one case, as a standalone Python script.

A layer finding (state lost between calls, a mask ignored, gradients off through the cache) is a
bug of the release's layer code, not of one kernel call, so the op's repro script cannot show it.
This one builds the release's layer as the sweep does (seeded, the case's heads, in the variant's
mode), draws the same x and dy, and runs the same rows (harness/upstream_layers.py): the layer on
its own kernels in one call and through the release's cache, against the same layer in float64
with our float64 reference in its kernels' place, bounded by our same-dtype baseline there; the
float64 chain through the cache against one float64 call; the input and cached states left
untouched; a left-padded batch. The harness code is copied in (`inspect.getsource`), so the
script's rows are the sweep's; it imports torch, the release and our references only.
"""
from __future__ import annotations

import pprint
import string
from pathlib import Path

from harness import cases, declaration, float32_helpers, packing, upstream, upstream_layers
from harness.cases import DTYPES
from harness.checks import bits, layer, segments
from harness.registry import get_op
from harness.repro import (COPIED_METRICS, COPIED_TOLERANCE, check_own_symbols, check_device, constants_text,
                           interpreted_text, literal, parse_case_id, sources)
from harness.tolerance import tolerance_for

# The harness code the script carries verbatim (the layer check and what it calls); the names it
# looks up elsewhere are the script's constants and two stand-ins (TEMPLATE).
_COPIED = (declaration.InputSpec, declaration.StateSpec, declaration.OptionSpec, declaration.Symbol,
           declaration.LayerSpec, declaration.OpSpec, declaration.load_function, cases.Case,
           packing.per_sequence, upstream.parameters_of, upstream.release_keywords, upstream._release_name,
           float32_helpers._cast, float32_helpers.in_float32,
           float32_helpers.helpers_in_float32,
           bits._bits, bits.bitwise_equal, bits.describe_difference, segments.segment_bounds,
           layer.run_segments, layer.tensors_in, layer.baseline_functions, layer.compare_runs, layer._prefixed,
           layer.chain_difference, layer.no_gradients_row,
           upstream_layers.in_kernel_transforms, upstream_layers.shape_arguments, upstream_layers._swap_state,
           upstream_layers.as_release_call, upstream_layers.kernels_replaced, upstream_layers._run,
           upstream_layers.lacks,
           upstream_layers.layer_rows, upstream_layers._padded_rows)
# the tensors whose tolerances the layer rows take (outputs as o, parameter gradients as dq)
_TOLERANCE_ROWS = ("o", "dq")


def script_name(case_id: str, variant: str, set_name: str) -> str:
    """The file name write_layer_repro gives a script when it is handed a folder."""
    return f"repro_{case_id}_{variant}_{set_name}_layer.py"


def write_layer_repro(case_id: str, path, set_name: str, variant: str | None = None,
                      device: str | None = None) -> Path:
    """Write the script reproducing the layer rows of set `set_name`'s own layer for `case_id`, in
    `variant`'s mode (default the op's first), to `path` (a folder: named by script_name); return
    its path. Everything is validated, with ValueError, before anything is written."""
    case = parse_case_id(case_id)
    spec = get_op(case.op)
    if spec.layer is None or set_name not in spec.layer.upstream:
        declared = sorted(spec.layer.upstream) if spec.layer else []
        raise ValueError(f"op {spec.name} declares no layer of set '{set_name}'"
                         + (f"; its layers' sets are {', '.join(declared)}." if declared else "."))
    variant = variant or next(iter(spec.variants))
    if variant not in spec.variants:
        raise ValueError(f"op {spec.name} has no variant '{variant}'; its variants are "
                         f"{', '.join(spec.variants)}.")
    check_own_symbols(spec, case)
    if case.packed or case.option != "none" or case.dtype not in DTYPES:
        raise ValueError(f"case '{case_id}' is not one the layer check runs: the layer takes plain "
                         f"batches in one of {', '.join(DTYPES)}, without an op option.")
    if device is not None:
        check_device(device)
    path = Path(path)
    if path.is_dir():
        path = path / script_name(case_id, variant, set_name)
    text = render_script(spec, case, variant, set_name, device, path.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def render_script(spec, case, variant: str, set_name: str, device: str | None, filename: str) -> str:
    """The script's text: TEMPLATE filled with the case's literals and the copied harness code."""
    target = spec.layer.upstream[set_name][0]
    tolerances = {name: tolerance_for(case.op, name, case.dtype, case.T, case.dtype) for name in _TOLERANCE_ROWS}
    fields = {
        "case_id": case.case_id, "filename": filename, "set": set_name, "layer": target,
        "variant": variant, "set_literal": literal(set_name), "variant_literal": literal(variant),
        "device": literal(device) if device else '"cuda" if torch.cuda.is_available() else "cpu"',
        "constants": constants_text(
            EARLIER_NAMES=upstream.EARLIER_NAMES, CHAIN_REL_TOL=layer.CHAIN_REL_TOL,
            CACHES=upstream_layers.CACHES, HELPERS=upstream_layers.HELPERS,
            CHAIN_REL_TOL_FLOAT32_HELPERS=upstream_layers.CHAIN_REL_TOL_FLOAT32_HELPERS,
            PADDED=upstream_layers.PADDED, PERFORMANCE_ONLY=upstream_layers.PERFORMANCE_ONLY,
            RELEASE_NAMES=upstream_layers.release_names(spec, set_name)),
        "interpreted_source": interpreted_text(),
        "copied_source": sources(_COPIED),
        "tolerance_source": sources(COPIED_TOLERANCE),
        "metrics_source": sources(COPIED_METRICS),
        "tolerances": "\n".join(f"    {literal(n)}: {t!r}," for n, t in tolerances.items()),
        "spec": pprint.pformat(spec, width=100), "case": pprint.pformat(case, width=100),
    }
    text = string.Template(TEMPLATE).substitute(fields)
    compile(text, filename, "exec")
    return text


TEMPLATE = '''\
"""Reproduces the layer check of $set's own layer ($layer, mode $variant) for harness case
$case_id.

The script stands alone (no harness import; the harness code it runs is copied in below). It
builds the release's layer as a sweep does (seeded by the case, the case's heads), draws the same
input x and output gradient dy, and prints the rows a sweep reports for that layer:
    y, d<parameter>        the layer on its own kernels, one call, against the same layer in
                           float64 with our float64 reference in its kernels' place (its helpers,
                           $set.modules, in float32), bounded by our same-dtype baseline there
    ... (segments)         the same through the release's cache, the sequence cut in segments
    float64 segments       the float64 layer through the cache against one float64 call: a layer
                           that loses or misplaces state between calls
    cache, x               the cached states handed in, and the input, left untouched
    y (padded batch, ...)  a left-padded batch against each sequence alone

Run it where torch, the release ($set) and our references import (the repository root):

    python $filename                  exit status 0 if every row passes, 1 if not
    python $filename --forward-only   the forward's rows alone (a function without a backward)
"""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import importlib
import inspect
import math
import os
import sys
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Callable

import torch

if not torch.cuda.is_available():
    # Without a GPU, Triton kernels run in its CPU interpreter; the switch precedes their import.
    os.environ.setdefault("TRITON_INTERPRET", "1")
$interpreted_source

# The case ---------------------------------------------------------------------------------------
SET = $set_literal   # the implementation set whose layer runs
VARIANT = $variant_literal   # the layer's mode
DEVICE = $device
BACKWARD = "--forward-only" not in sys.argv[1:]
$constants
_depth = [0]   # helper calls under way (in_float32)


# The harness's code, copied verbatim: the declaration's types, the case, the layer check and what
# it calls. SPEC and CASE below say what runs.
$copied_source


$tolerance_source


$metrics_source


SPEC = $spec
CASE = $case
TOLERANCES = {   # the case's tolerance of the layer's outputs (as o) and parameter gradients (as dq)
$tolerances
}


def tolerance_for(op, tensor, *dtype_and_length):
    """The harness's tolerance of the case (harness/tolerance.py), as the literals above."""
    return TOLERANCES[tensor]


def release_names(spec, set_name):
    """The names under which the release's layers call the op's functions (RELEASE_NAMES)."""
    return RELEASE_NAMES


def make_row(check, tensor, **fields):
    return {"tensor": tensor, **fields}


def print_rows(rows):
    """One aligned line per row, then the reason for each that did not pass."""
    width = max(len(row["tensor"]) for row in rows) + 2
    print(f"{'row':<{width}}{'err':>11}{'baseline err':>14}{'bound':>11}{'err/bound':>11}  verdict")
    for row in rows:
        numbers = "".join("-".rjust(w) if row.get(key) is None else f"{row[key]:>{w}{form}}"
                          for key, w, form in (("err", 11, ".3e"), ("base_err", 14, ".3e"),
                                               ("bound", 11, ".3e"), ("ratio", 11, ".3g")))
        print(f"{row['tensor']:<{width}}{numbers}  {row['verdict']}")
    reasons = [f"{row['tensor']}: {row['message']}" for row in rows
               if row.get("message") and row["verdict"] != "PASS"]
    if reasons:
        print("\\n" + "\\n".join(reasons))


if __name__ == "__main__":
    print(f"case {CASE.case_id}: {SPEC.layer.upstream[SET][0]} in mode {VARIANT} on {DEVICE}"
          + ("" if BACKWARD else ", forward only") + "\\n")
    rows = layer_rows(SPEC, CASE, SimpleNamespace(variant=VARIANT), SET, DEVICE, make_row, BACKWARD)
    print_rows(rows)
    bad = [row["tensor"] for row in rows if row["verdict"] in ("FAIL", "ERROR")]
    counts = ", ".join(f"{n} {v}" for v, n in sorted(collections.Counter(r["verdict"] for r in rows).items()))
    print(f"\\n{'FAIL: ' + ', '.join(bad) if bad else 'PASS'} (rows: {counts})")
    sys.exit(1 if bad else 0)
'''
