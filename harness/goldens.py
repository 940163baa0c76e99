"""The float64 golden and the same-dtype baseline of a case, through the golden cache."""
from __future__ import annotations

import functools
import time

import torch

from harness.cases import Case
from harness.execution import execute
from harness.inputs import CaseInputs
from harness.packing import per_sequence
from harness.declaration import OpSpec, load_function


def baseline_function(spec: OpSpec, case: Case):
    """The same-dtype baseline: the chunked reference with its products' operands in the case's
    dtype, in chunks of the op's `baseline_chunk_size`; sequence by sequence when packed."""
    baseline_fn = functools.partial(load_function(spec.reference_chunked), operand_dtype=case.torch_dtype,
                                    chunk_size=spec.baseline_chunk_size)
    return per_sequence(baseline_fn, spec.under(case.option)) if case.packed else baseline_fn


def golden_and_baseline(spec: OpSpec, case: Case, inputs: CaseInputs, cache=None, golden=None,
                        **options) -> tuple[dict, dict]:
    """The float64 golden (loop for short T, chunked form beyond) and the same-dtype baseline,
    taken from `cache` (a GoldenCache) when it has them, and stored there when computed.

    `golden` given: only the baseline is computed, and stored (a chain of segments changes the
    rounding of the same-dtype arithmetic, not the float64 truth). A packed case's references
    run sequence by sequence (`per_sequence`)."""
    given = golden is not None
    if cache is not None:
        found = cache.get(spec, case, options, inputs.do.device, golden_given=given)
        if found is not None:
            return (golden if given else found[0]), found[1]
    start = time.perf_counter()
    golden_fn = load_function(spec.reference_loop if inputs.dims["T"] <= spec.loop_max_T else spec.reference_chunked)
    if case.packed:
        golden_fn = per_sequence(golden_fn, spec.under(case.option))
    baseline_fn = baseline_function(spec, case)
    if not given:
        golden = execute(golden_fn, spec, case, inputs, to_dtype=torch.float64, **options)
    baseline = execute(baseline_fn, spec, case, inputs, **options)
    if cache is not None:
        if inputs.do.device.type == "cuda":
            torch.cuda.synchronize()
        cache.put(spec, case, options, None if given else golden, baseline, time.perf_counter() - start)
    return golden, baseline
