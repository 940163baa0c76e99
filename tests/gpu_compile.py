"""Compile the kernel specialisations a workload launches for a Hopper GPU, on a machine without one.

The interpreter hides what only the compiler rejects (loop-carried values that change shape, broadcasts
of mismatched blocks, dtype clashes in `tl.dot`). `record_launches` runs a workload under the
interpreter with launches recorded instead of executed, GPU numerics selected (bf16 dot operands, no
fp32 stores); `compile_records` then compiles each distinct specialisation to sm_90 machine code in a
process where `triton.jit` is the real compiler, and checks that its shared memory fits the GPU (a
kernel over the limit compiles but fails at launch with OutOfResources) and that its software
pipeline reads no buffer the next stage's copy is refilling (tests/pipeline_races.py).
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from unittest import mock

import torch

TENSOR_TYPES = {torch.float64: "*fp64", torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16",
                torch.int32: "*i32", torch.int64: "*i64"}
OPTION_NAMES = ("num_warps", "num_stages")
SHARED_MEMORY_LIMIT = {90: 232448}  # bytes a block may opt in to (H100: 227 KiB)


def _is_constexpr(param: inspect.Parameter) -> bool:
    note = param.annotation
    return "constexpr" in (note if isinstance(note, str) else getattr(note, "__name__", str(note)))


def _encode(value):
    import triton.language as tl
    if isinstance(value, tl.dtype):
        return {"tl_dtype": value.name}
    return value


def _decode(value):
    import triton.language as tl
    if isinstance(value, dict) and "tl_dtype" in value:
        return getattr(tl, {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(
            value["tl_dtype"], value["tl_dtype"]))
    return value


def _describe_launch(fn, args, kwargs) -> dict:
    params = list(inspect.signature(fn).parameters.values())
    bound = dict(zip([p.name for p in params], args))
    bound.update({k: v for k, v in kwargs.items() if k not in OPTION_NAMES})
    signature, constexprs = {}, {}
    for p in params:
        value = bound.get(p.name, p.default)
        if _is_constexpr(p) or value is None:
            signature[p.name] = "constexpr"
            constexprs[p.name] = _encode(value)
        elif isinstance(value, torch.Tensor):
            signature[p.name] = TENSOR_TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[p.name] = "i1"
        elif isinstance(value, int):
            signature[p.name] = "i32" if -2**31 <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[p.name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: cannot type argument {p.name}={value!r}")
    options = {k: kwargs[k] for k in OPTION_NAMES if k in kwargs}
    return {"module": fn.__module__, "name": fn.__name__, "signature": signature,
            "constexprs": constexprs, "options": options}


@contextmanager
def recording_launches():
    """Within the block, kernel launches are recorded (list yielded) and not executed."""
    from triton.runtime.interpreter import InterpretedFunction
    records = []

    def record(self, *args, grid, warmup, **kwargs):
        records.append(_describe_launch(self.fn, args, kwargs))

    with mock.patch.object(InterpretedFunction, "run", record), \
            mock.patch("fla_kernels.precision.interpreter_numerics", return_value=False):
        yield records


def distinct(records: list[dict]) -> list[dict]:
    seen, result = set(), []
    for rec in records:
        key = json.dumps(rec, sort_keys=True)
        if key not in seen:
            seen.add(key)
            result.append(rec)
    return result


def compile_records(records: list[dict], arch: int = 90, timeout: float = 1200,
                    resources: bool = False) -> list[dict]:
    """Compile each record for sm_<arch> in a fresh process; one {name, ok, error} per record, with
    resources also {registers, spill_stores, spill_loads} (bytes per thread) from ptxas."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    command = [sys.executable, "-m", "tests.gpu_compile", str(arch)] + (["resources"] if resources else [])
    proc = subprocess.run(command, input=json.dumps(records), capture_output=True, text=True, env=env,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the compile process failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def _chain(exc: BaseException) -> str:
    """An exception and its causes, innermost last, each cut to its end: a compile error inside a
    called @triton.jit function is reported at the call, its reason in the cause."""
    parts = []
    while exc is not None and len(parts) < 4:
        parts.append(f"{type(exc).__name__}: {exc}"[-1500:])
        exc = exc.__cause__ or exc.__context__
    return "\n caused by ".join(parts)


def _resources(ptx: str, arch: int) -> dict:
    """ptxas' register and spill counts of a compiled kernel's PTX (sm_<arch>a)."""
    import re
    import tempfile
    from triton.backends.nvidia.compiler import get_ptxas
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        proc = subprocess.run([get_ptxas(arch).path, "--gpu-name", f"sm_{arch}a", "-v", f.name, "-o", os.devnull],
                              capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, text)) else None
    return {"registers": number(r"Used (\d+) registers"), "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads")}


def _compile_main(arch: int, resources: bool = False):
    import triton
    from tests.pipeline_races import stale_reads
    from triton.backends.compiler import GPUTarget
    records = json.loads(sys.stdin.read())
    target = GPUTarget("cuda", arch, 32)
    results = []
    for rec in records:
        fn = getattr(importlib.import_module(rec["module"]), rec["name"])
        while not isinstance(fn, triton.runtime.jit.JITFunction) and hasattr(fn, "fn"):
            fn = fn.fn   # an upstream kernel under @triton.autotune or @triton.heuristics
        constexprs = {k: _decode(v) for k, v in rec["constexprs"].items()}
        src = triton.compiler.ASTSource(fn=fn, signature=rec["signature"], constexprs=constexprs)
        try:
            compiled = triton.compile(src, target=target, options=rec["options"])
            shared = compiled.metadata.shared
            limit = SHARED_MEMORY_LIMIT[arch]
            races = stale_reads(compiled.asm["ttgir"])
            error = (f"OutOfResources: needs {shared} bytes of shared memory, sm_{arch} has {limit}"
                     if shared > limit else
                     "PipelineRace: a pipelined shared-memory read after the copy that refills its buffer "
                     f"(tests/pipeline_races.py): {races[0]}" if races else "")
            results.append({"name": rec["name"], "ok": not error, "error": error, "shared": shared,
                            "constexprs": rec["constexprs"], "options": rec["options"],
                            **(_resources(compiled.asm["ptx"], arch) if resources else {})})
        except Exception as exc:  # every failure is reported, the others still compile
            results.append({"name": rec["name"], "ok": False, "error": _chain(exc),
                            "constexprs": rec["constexprs"]})
    print(json.dumps(results))


if __name__ == "__main__":
    _compile_main(int(sys.argv[1]), "resources" in sys.argv[2:])
