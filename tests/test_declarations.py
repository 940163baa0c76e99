"""Every declared op is complete: its kernels exported, its references and layer resolving, its
shape symbols known to every preset and CSV, its baselines present for every gate suite, the README
naming it. Adding an op that misses one of these fails here, naming the op and what is missing
(`missing`); the toy op of tests/toy_op.py, declared outside the op folders, shows each gap named."""
import dataclasses
import json
from dataclasses import fields
from pathlib import Path

import pandas as pd
import pytest
import torch

import fla_kernels
from harness import upstream
from harness.cases import PRESETS, Case
from harness.checks.layer import build_layer
from harness.declaration import CORE_SYMBOLS, InputSpec, load_function
from harness.registry import OPS, load_declarations
from reports.schema import SHAPE

ROOT = Path(__file__).resolve().parent.parent
SUITES = json.loads((ROOT / "baselines" / "gate.json").read_text())["suites"]


def missing(spec) -> list[str]:
    """What the op `spec` lacks of a complete op, one phrase each; empty when complete."""
    gaps = []
    if spec.declared_in != f"fla_kernels.ops.{spec.name}.declaration":
        gaps.append(f"declared in {spec.declared_in}, not fla_kernels/ops/{spec.name}/declaration.py")
    for variant, target in spec.variants.items():
        name = load_function(target).__name__
        if name not in fla_kernels.__all__ or getattr(fla_kernels, name) is not load_function(target):
            gaps.append(f"variant {variant} ({target}) is not exported from fla_kernels")
    for target in (spec.reference_loop, spec.reference_chunked, *(t for targets in spec.upstream.values()
                                                                  for t in targets.values())):
        if not target.startswith("fla."):   # upstream fla need not be installed
            load_function(target)
    for name, targets in spec.upstream.items():
        if name not in upstream.SETS or not set(targets) <= set(spec.variants):
            gaps.append(f"upstream set {name} is unknown or names variants the op lacks")
    case_fields = {f.name for f in fields(Case)}
    for symbol in spec.used_symbols():
        if symbol not in SHAPE or symbol not in case_fields:
            gaps.append(f"symbol {symbol} is no column of reports/schema.SHAPE or field of Case")
        elif symbol not in CORE_SYMBOLS and (symbol not in spec.symbols
                                             or set(spec.symbols[symbol].presets) != set(PRESETS)):
            gaps.append(f"symbol {symbol} has no values for every preset")
    for suite in SUITES:
        path = ROOT / "baselines" / suite / f"{spec.name}.csv"
        if not path.exists():
            gaps.append(f"no baseline {path.relative_to(ROOT)} (python -m harness gate --op {spec.name} "
                        "--update-baseline)")
        elif not set(spec.variants) <= set(pd.read_csv(path, usecols=["variant"])["variant"]):
            gaps.append(f"baseline {path.relative_to(ROOT)} lacks a variant")
    row = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith(f"| `{spec.name}` |")]
    if not row or not row[0].rstrip(" |").endswith(", ".join(spec.variants)):
        gaps.append("README.md's table of ops has no row listing its variants")
    return gaps


@pytest.mark.parametrize("op", list(OPS))
def test_every_declared_op_is_complete(op):
    assert missing(OPS[op]) == []


def test_an_op_declared_outside_the_op_folders_is_told_each_thing_it_lacks():
    toy = load_declarations(["tests.toy_op"])["toy_decay"]
    gaps = missing(toy)
    assert gaps[0] == "declared in tests.toy_op, not fla_kernels/ops/toy_decay/declaration.py"
    assert "variant chunk (tests.toy_op:chunk_toy_decay) is not exported from fla_kernels" in gaps
    assert "no baseline baselines/cpu/toy_decay.csv (python -m harness gate --op toy_decay --update-baseline)" \
        in gaps
    assert gaps[-1] == "README.md's table of ops has no row listing its variants"
    assert len(gaps) == 1 + len(toy.variants) + len(SUITES) + 1
    slots = dataclasses.replace(toy, inputs=toy.inputs + (InputSpec("s", ("B", "T", "H", "M")),))
    assert "symbol M has no values for every preset" in missing(slots)
    unknown = dataclasses.replace(toy, inputs=toy.inputs + (InputSpec("s", ("B", "T", "H", "N")),))
    assert "symbol N is no column of reports/schema.SHAPE or field of Case" in missing(unknown)


@pytest.mark.parametrize("op", [op for op, spec in OPS.items() if spec.layer is not None])
def test_the_layer_builds_and_runs(op):
    spec = OPS[op]
    case = Case(op=op, dtype="fp32", B=1, T=3, H=2, K=8, V=8, h0="none", gate="normal", seed=0,
                **{s: 4 for s in spec.symbols})
    layer = build_layer(spec, case, "cpu", torch.float32)
    layer.kernel = load_function(spec.reference_chunked)
    y, _, _ = layer(torch.randn(1, 3, case.H * case.V), use_cache=True)
    assert y.shape == (1, 3, case.H * case.V)
