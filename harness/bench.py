"""`python -m harness bench`: forward and forward+backward times of every implementation of an op
(ours, upstream fla where it imports, the eager torch reference) on one shape, with nominal
TFLOP/s and GB/s and the first call's compile and autotune time.

Times are triton.testing.do_bench's median and quartiles (CUDA events; the L2 cache is flushed
between repetitions). The first call runs on an empty Triton cache (a fresh TRITON_CACHE_DIR) so
it measures compilation and autotuning, not a cache lookup. Rows reach bench.csv as each
measurement finishes.

Throughput is nominal, the same for every implementation of an op, so TFLOP/s compare like times:
FLOPs are those of the chunked algorithm with chunks of C = 64, per batch and head
    forward  2 T (C K + C V + 2 K V)      (scores, scores @ v, chunk states, q @ states)
    backward twice the forward            (every product has two gradient products)
(gsa: the same for its two passes, K -> M and M -> V); bytes are reading every input and writing
o once (forward), plus reading do and writing every input gradient (backward).
"""
from __future__ import annotations

import contextlib
import csv
import functools
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.cases import Case
from harness.environment import run_fields
from harness.inputs import make_inputs
from harness.declaration import OpSpec, load_function

CHUNK = 64
QUANTILES = [0.5, 0.25, 0.75]


@dataclass
class Candidate:
    impl: str        # "ours", "fla", "torch"
    variant: str
    target: str      # "module:function" or a description
    fn: object = None
    error: str = ""  # why it could not be loaded
    skip: str = ""   # why it is not timed here (its package is not installed)


def candidates(spec: OpSpec, variants, sources) -> list[Candidate]:
    """What to time: our variants, fla's (where it imports) and the eager chunked reference."""
    from harness import upstream
    found = []
    if "ours" in sources:
        found += [Candidate("ours", v, spec.variants[v]) for v in variants]
    if "fla" in sources:
        why = upstream.available("fla")
        for variant, target in upstream.targets("fla", spec.name).items():
            if variant in variants:
                found.append(Candidate("fla", variant, target, skip=why))
    if "torch" in sources:
        found.append(Candidate("torch", "chunked reference", spec.reference_chunked))
    for c in found:
        if c.skip:
            continue
        try:   # fla's called as the sweep calls it: fitted to its release
            fn = upstream.set_function(c.target, spec) if c.impl == "fla" else load_function(c.target)
        except ValueError as exc:
            c.error = str(exc)
            continue
        c.fn = fn if c.impl != "torch" else functools.partial(fn, chunk_size=CHUNK, operand_dtype=None)
    return found


def nominal_flops(spec: OpSpec, case: Case) -> float:
    """Forward FLOPs of the chunked algorithm (see the module docstring): one pass per state,
    over the state's last two dimensions (K -> V; gsa K -> M and M -> V)."""
    dims = case.dims()

    def one_pass(K, V):
        return 2 * case.T * (CHUNK * K + CHUNK * V + 2 * K * V)
    per_head = sum(one_pass(dims[s.shape[-2]], dims[s.shape[-1]]) for s in spec.states)
    return float(case.B * case.H * per_head)


def nominal_bytes(inputs, o_numel: int) -> tuple[float, float]:
    """(forward bytes, forward+backward bytes)."""
    size = inputs.do.element_size()
    read = sum(x.numel() * x.element_size() for x in inputs.tensors.values())
    forward = read + o_numel * size
    return float(forward), float(forward + o_numel * size + 2 * read)


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn, quantiles=QUANTILES):
    """(median, q25, q75) in ms: do_bench on a GPU; on the CPU a plain median of a few runs."""
    if torch.cuda.is_available():
        from triton.testing import do_bench
        return tuple(do_bench(fn, quantiles=quantiles))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    q = statistics.quantiles(times, n=4)
    return statistics.median(times), q[0], q[2]


def _leaves(inputs, grad):
    return [x.detach().clone().requires_grad_(grad) for x in inputs.tensors.values()]


def _backward_pass(call, leaves, do):
    """One forward+backward from leaves whose gradients are dropped first, so that each pass
    assigns its gradients, as a layer's inputs receive them, instead of adding them into the last
    pass's (an elementwise kernel per input that is no part of the candidate: 0.28 ms of
    delta_rule's 5.6 at the bench shape on the H200)."""
    for x in leaves:
        x.grad = None
    call(*leaves)[0].backward(do)


def measure(c: Candidate, spec: OpSpec, case: Case, inputs) -> list[dict]:
    """The rows of one candidate: first forward, first backward, forward, forward+backward."""
    rows = []

    def row(phase, median=None, q25=None, q75=None, flops=None, nbytes=None, message=""):
        thr = {} if median is None or flops is None else {
            "tflops": flops / (median * 1e-3) / 1e12, "gbps": nbytes / (median * 1e-3) / 1e9}
        rows.append({"impl": c.impl, "variant": c.variant, "phase": phase, "median_ms": median,
                     "q25_ms": q25, "q75_ms": q75, "message": message, **thr})

    if c.skip or c.error:
        row("fwd", message=f"SKIP: {c.skip}" if c.skip else f"ERROR: {c.error}")
        return rows
    call = functools.partial(c.fn, scale=inputs.scale)
    flops = nominal_flops(spec, case)

    def failed(phase, exc):
        text = str(exc).strip().splitlines()
        if getattr(exc, "verdict", "") == "SKIP":   # what a release lacks (harness.upstream)
            row(phase, message=f"SKIP: {text[0] if text else ''}"[:300])
        else:
            row(phase, message=f"ERROR: {type(exc).__name__}: {text[0] if text else ''}"[:300])

    leaves = _leaves(inputs, True)
    try:  # the forward is timed even when the backward refuses to run
        start = time.perf_counter()
        o, _ = call(*leaves)
        _sync()
        row("first fwd", (time.perf_counter() - start) * 1e3)
        fwd_bytes, both_bytes = nominal_bytes(inputs, o.numel())
        plain = _leaves(inputs, False)
        with torch.no_grad():
            row("fwd", *_timed(lambda: call(*plain)), flops=flops, nbytes=fwd_bytes)
    except Exception as exc:  # a failed measurement is a row, and the others go on
        failed("fwd", exc)
        return rows
    try:
        start = time.perf_counter()
        o.backward(inputs.do)
        _sync()
        row("first bwd", (time.perf_counter() - start) * 1e3)
        row("fwd+bwd", *_timed(lambda: _backward_pass(call, leaves, inputs.do)), flops=3 * flops,
            nbytes=both_bytes)
    except Exception as exc:
        failed("fwd+bwd", exc)
    return rows


def kernel_rows(c: Candidate, inputs) -> list[dict]:
    """Per-kernel device time of the candidate's forward+backward pass (`harness.kernel_profile`);
    [] without CUDA, or when the candidate did not load."""
    from harness.kernel_profile import device_events, per_pass
    if c.fn is None:
        return []
    leaves = _leaves(inputs, True)
    call = functools.partial(c.fn, scale=inputs.scale)
    return per_pass(device_events(lambda: _backward_pass(call, leaves, inputs.do)))


def cold_triton_cache() -> str:
    """Point Triton at an empty cache so first calls compile; returns the folder."""
    folder = tempfile.mkdtemp(prefix="harness-bench-triton-")
    os.environ["TRITON_CACHE_DIR"] = folder
    return folder


def run_bench(plan, out_dir: Path, run_id: str, echo=print, kernels: bool = False) -> Path:
    """plan: [(spec, case, [Candidate])]; writes <out_dir>/bench.csv row by row; returns its path.

    kernels: also <out_dir>/kernels.csv, the per-kernel split of every candidate whose
    forward+backward pass ran (`kernel_rows`).
    """
    from reports.schema import BENCH_COLUMNS, KERNEL_COLUMNS
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench.csv"
    shared = {"run_id": run_id, **run_fields()}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with contextlib.ExitStack() as stack:
        f = stack.enter_context(open(path, "w", newline=""))
        writer = csv.DictWriter(f, fieldnames=BENCH_COLUMNS)
        writer.writeheader()
        if kernels:
            fk = stack.enter_context(open(out_dir / "kernels.csv", "w", newline=""))
            kernel_writer = csv.DictWriter(fk, fieldnames=KERNEL_COLUMNS)
            kernel_writer.writeheader()
        for spec, case, found in plan:
            inputs = make_inputs(spec, case, device)
            fields = {"op": case.op, "dtype": case.dtype, **case.dims(), **shared}
            for c in found:
                rows = measure(c, spec, case, inputs)
                writer.writerows({k: v for k, v in {**fields, **r}.items() if k in BENCH_COLUMNS}
                                 for r in rows)
                f.flush()
                echo(_progress_line(case.op, c, rows), flush=True)
                if kernels and _ran_backward(rows):
                    split = kernel_rows(c, inputs)
                    kernel_writer.writerows({k: v for k, v in {**fields, "impl": c.impl,
                                                               "variant": c.variant, **r}.items()
                                             if k in KERNEL_COLUMNS} for r in split)
                    fk.flush()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return path


def _ran_backward(rows) -> bool:
    return any(r["phase"] == "fwd+bwd" and r["median_ms"] is not None for r in rows)


def _progress_line(op, c: Candidate, rows) -> str:
    by_phase = {r["phase"]: r for r in rows}
    failed = [r["message"] for r in rows if r["message"]]
    parts = [f"{p} {by_phase[p]['median_ms']:.3f} ms" for p in ("fwd", "fwd+bwd")
             if p in by_phase and by_phase[p]["median_ms"] is not None]
    parts += [f"{p} {by_phase[p]['median_ms'] / 1e3:.1f} s" for p in ("first fwd", "first bwd")
              if p in by_phase]
    return f"{op} {c.impl} {c.variant}: " + (", ".join(parts) or "") + (f" {failed[0]}" if failed else "")
