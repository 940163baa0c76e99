"""Compile the kernel specialisations a workload launches for a Hopper GPU, on a machine without one.

The interpreter hides what only the compiler rejects (loop-carried values that change shape, broadcasts
of mismatched blocks, dtype clashes in `tl.dot`). `record_launches` runs a workload under the
interpreter with launches recorded instead of executed, GPU numerics selected (bf16 dot operands, no
fp32 stores), each with the specialisation a GPU's launcher gives its arguments (divisibility 16 of
aligned pointers and ints, ints equal to 1 as constants: the loads vectorise as they do there);
`compile_records` then compiles each distinct specialisation to sm_90 machine code in a
process where `triton.jit` is the real compiler, and checks that its shared memory fits the GPU (a
kernel over the limit compiles but fails at launch with OutOfResources) and that its software
pipeline reads no buffer the next stage's copy is refilling (tests/pipeline_races.py).
"""
from __future__ import annotations

import importlib
import inspect
import json
import math
import os
import subprocess
import sys
from contextlib import contextmanager
from unittest import mock

import torch

OPTION_NAMES = ("num_warps", "num_stages", "maxnreg")
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


def _specialisation(value, specialize: bool, align: bool) -> tuple:
    """(type, attribute) of a runtime argument as Triton's launcher specialises it: an int equal to 1
    becomes the constexpr 1, and an int divisible by 16 or a tensor whose data is 16-byte aligned
    gets "D" (divisibility 16), unless the kernel's do_not_specialize(_on_alignment) names it."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    return native_specialize_impl(BaseBackend, value, False, specialize, align)


def _describe_launch(fn, args, kwargs, jit_options: dict) -> dict:
    """One launch as `compile_records` takes it: the kernel, its signature, constexprs and the
    specialisation attributes (`_specialisation`) the real launcher would give these arguments,
    and its launch options."""
    params = list(inspect.signature(fn).parameters.values())
    names = [p.name for p in params]
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k not in OPTION_NAMES})
    unspecialised = lambda option: {names[n] if isinstance(n, int) else n for n in jit_options.get(option) or ()}
    fixed, unaligned = unspecialised("do_not_specialize"), unspecialised("do_not_specialize_on_alignment")
    signature, constexprs, attrs = {}, {}, {}
    for p in params:
        value = bound.get(p.name, p.default)
        if _is_constexpr(p) or value is None:
            signature[p.name] = "constexpr"
            constexprs[p.name] = _encode(value)
        elif isinstance(value, (torch.Tensor, bool, int, float)):
            kind, attr = _specialisation(value, p.name not in fixed, p.name not in unaligned)
            if kind == "constexpr":
                constexprs[p.name] = attr
            elif attr:
                attrs[p.name] = attr
            signature[p.name] = kind
        else:
            raise TypeError(f"{fn.__name__}: cannot type argument {p.name}={value!r}")
    options = {k: kwargs[k] for k in OPTION_NAMES if k in kwargs}
    return {"module": fn.__module__, "name": fn.__name__, "signature": signature,
            "constexprs": constexprs, "attrs": attrs, "options": options}


def _programs(grid, fn, args, kwargs: dict) -> int:
    """How many programs a launch of fn on `grid` runs: a tuple, or as Triton takes it a function
    of the launch's arguments by name."""
    if callable(grid):
        grid = grid({**dict(zip(inspect.signature(fn).parameters, args)), **kwargs})
    return math.prod(int(d) for d in grid)


@contextmanager
def recording_launches():
    """Within the block, kernel launches are recorded (list yielded, each with its `programs`)
    and not executed."""
    from triton.runtime.interpreter import InterpretedFunction
    records = []

    def record(self, *args, grid, warmup, **kwargs):
        records.append({**_describe_launch(self.fn, args, kwargs, self.kwargs),
                        "programs": _programs(grid, self.fn, args, kwargs)})

    with mock.patch.object(InterpretedFunction, "run", record), \
            mock.patch("fla_kernels.precision.interpreter_numerics", return_value=False):
        yield records


def distinct(records: list[dict]) -> list[dict]:
    """One record per specialisation, in first-launch order, with the most programs any of its
    launches ran."""
    result = {}
    for rec in records:
        key = json.dumps({k: v for k, v in rec.items() if k != "programs"}, sort_keys=True)
        if key in result:
            result[key]["programs"] = max(result[key].get("programs", 0), rec.get("programs", 0))
        else:
            result[key] = dict(rec)
    return list(result.values())


def compile_records(records: list[dict], arch: int = 90, timeout: float = 1200,
                    resources: bool = False, asm_dir: str | None = None, sites: bool = False) -> list[dict]:
    """Compile each record for sm_<arch> in a fresh process; one {name, ok, error, programs} per
    record, with resources also {registers, spill_stores, spill_loads} (bytes per thread) from ptxas. asm_dir:
    where each compiled record's TTGIR and PTX go, as NAME-INDEX.ttgir / .ptx (INDEX: its place in
    records). sites (with resources): also spill_sites, the source lines a spilling kernel spills
    at most (tests/spill_sites.py)."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    command = ([sys.executable, "-m", "tests.gpu_compile", str(arch)] + (["resources"] if resources else [])
               + (["sites"] if sites else []) + ([f"asm={asm_dir}"] if asm_dir else []))
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


def _resources(ptx: str, arch: int, sites: bool = False) -> dict:
    """ptxas' register and spill counts of a compiled kernel's PTX (sm_<arch>a); with sites the
    same assembly carries line information and, where it spills, where (`spill_sites.top_sites`)."""
    import re
    import tempfile
    from triton.backends.nvidia.compiler import get_ptxas
    ptxas = get_ptxas(arch).path
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run([ptxas, "--gpu-name", f"sm_{arch}a", "-v", *(["-lineinfo"] if sites else []), src,
                               "-o", cubin], capture_output=True, text=True)
        text = proc.stdout + proc.stderr
        number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, text)) else None
        found = {"registers": number(r"Used (\d+) registers"), "spill_stores": number(r"(\d+) bytes spill stores"),
                 "spill_loads": number(r"(\d+) bytes spill loads")}
        if sites and (found["spill_stores"] or found["spill_loads"]):
            from tests.spill_sites import top_sites
            found["spill_sites"] = top_sites(cubin, os.path.join(os.path.dirname(ptxas), "nvdisasm"))
    return found


def _write_asm(asm_dir: str, stem: str, asm: dict):
    """The TTGIR and PTX of one compiled kernel into asm_dir/stem.ttgir and .ptx."""
    os.makedirs(asm_dir, exist_ok=True)
    for kind in ("ttgir", "ptx"):
        with open(os.path.join(asm_dir, f"{stem}.{kind}"), "w") as f:
            f.write(asm[kind])


def _compile_main(arch: int, resources: bool = False, asm_dir: str | None = None, sites: bool = False):
    import triton
    from tests.pipeline_races import stale_reads
    from triton.backends.compiler import BaseBackend, GPUTarget
    records = json.loads(sys.stdin.read())
    target = GPUTarget("cuda", arch, 32)
    results = []
    for index, rec in enumerate(records):
        fn = getattr(importlib.import_module(rec["module"]), rec["name"])
        while not isinstance(fn, triton.runtime.jit.JITFunction) and hasattr(fn, "fn"):
            fn = fn.fn   # an upstream kernel under @triton.autotune or @triton.heuristics
        constexprs = {k: _decode(v) for k, v in rec["constexprs"].items()}
        attrs = {(fn.arg_names.index(name),): BaseBackend.parse_attr(attr)
                 for name, attr in rec.get("attrs", {}).items()}
        src = triton.compiler.ASTSource(fn=fn, signature=rec["signature"], constexprs=constexprs, attrs=attrs)
        try:
            compiled = triton.compile(src, target=target, options=rec["options"])
            shared = compiled.metadata.shared
            if asm_dir:
                _write_asm(asm_dir, f"{rec['name']}-{index}", compiled.asm)
            limit = SHARED_MEMORY_LIMIT[arch]
            races = stale_reads(compiled.asm["ttgir"])
            error = (f"OutOfResources: needs {shared} bytes of shared memory, sm_{arch} has {limit}"
                     if shared > limit else
                     "PipelineRace: a pipelined shared-memory read after the copy that refills its buffer "
                     f"(tests/pipeline_races.py): {races[0]}" if races else "")
            results.append({"name": rec["name"], "ok": not error, "error": error, "shared": shared,
                            "constexprs": rec["constexprs"], "options": rec["options"],
                            "programs": rec.get("programs"),
                            **(_resources(compiled.asm["ptx"], arch, sites) if resources else {})})
        except Exception as exc:  # every failure is reported, the others still compile
            results.append({"name": rec["name"], "ok": False, "error": _chain(exc),
                            "constexprs": rec["constexprs"], "programs": rec.get("programs")})
    print(json.dumps(results))


if __name__ == "__main__":
    asm = [a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("asm=")]
    _compile_main(int(sys.argv[1]), "resources" in sys.argv[2:], asm[0] if asm else None, "sites" in sys.argv[2:])
