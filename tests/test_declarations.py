"""Every declared op is complete: its kernels exported, its references and layer resolving, its
shape symbols known to every preset and CSV, its baselines present for every gate suite, the README
naming it. Adding an op that misses one of these fails here, naming the op and what is missing."""
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
from harness.declaration import CORE_SYMBOLS, load_function
from harness.registry import OPS
from reports.schema import SHAPE

ROOT = Path(__file__).resolve().parent.parent
SUITES = json.loads((ROOT / "baselines" / "gate.json").read_text())["suites"]


@pytest.mark.parametrize("op", list(OPS))
def test_the_declaration_lives_in_its_op_folder_and_its_functions_resolve(op):
    spec = OPS[op]
    assert spec.declared_in == f"fla_kernels.ops.{op}.declaration"
    for variant, target in spec.variants.items():
        fn = load_function(target)
        assert fn.__name__ in fla_kernels.__all__ and getattr(fla_kernels, fn.__name__) is fn, (op, variant)
    for target in (spec.reference_loop, spec.reference_chunked):
        load_function(target)
    for name, targets in spec.upstream.items():
        assert name in upstream.SETS and set(targets) <= set(spec.variants), (op, name)


@pytest.mark.parametrize("op", list(OPS))
def test_every_shape_symbol_is_known_to_cases_presets_and_csvs(op):
    spec = OPS[op]
    case_fields = {f.name for f in fields(Case)}
    for symbol in spec.used_symbols():
        assert symbol in SHAPE and symbol in case_fields, (op, symbol)
        if symbol not in CORE_SYMBOLS:
            assert set(spec.symbols[symbol].presets) == set(PRESETS), (op, symbol)
    assert set(spec.symbols) <= set(spec.used_symbols()), op


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("suite", list(SUITES))
def test_baselines_exist_for_every_gate_suite_and_variant(op, suite):
    path = ROOT / "baselines" / suite / f"{op}.csv"
    assert path.exists(), f"{path.relative_to(ROOT)} is missing: python -m harness gate --op {op} --update-baseline"
    variants = set(pd.read_csv(path, usecols=["variant"])["variant"])
    assert set(OPS[op].variants) <= variants, (op, suite)


@pytest.mark.parametrize("op", list(OPS))
def test_the_readme_lists_the_op_and_its_variants(op):
    row = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith(f"| `{op}` |")]
    assert row, f"README.md's table of ops has no row for {op}"
    assert row[0].rstrip(" |").endswith(", ".join(OPS[op].variants)), row[0]


@pytest.mark.parametrize("op", [op for op, spec in OPS.items() if spec.layer is not None])
def test_the_layer_builds_and_runs(op):
    spec = OPS[op]
    case = Case(op=op, dtype="fp32", B=1, T=3, H=2, K=8, V=8, h0="none", gate="normal", seed=0,
                **{s: 4 for s in spec.symbols})
    layer = build_layer(spec, case, "cpu", torch.float32)
    layer.kernel = load_function(spec.reference_chunked)
    y, _, _ = layer(torch.randn(1, 3, case.H * case.V), use_cache=True)
    assert y.shape == (1, 3, case.H * case.V)
