"""Change-aware selection: a changed file selects the ops whose numbers it can move, no fewer."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.cases import Case
from harness.changes import ROOT, changed_files, entry_modules, import_graph, ops_for_path, select_ops
from harness.inputs import make_inputs
from harness.checks.layer import build_layer, layer_class
from harness.declaration import load_function
from harness.registry import OPS
from harness.execution import run_implementation
from harness.goldens import golden_and_baseline

EVERY_OP = list(OPS)
WITH_LAYERS = [op for op, spec in OPS.items() if spec.layer is not None]
DELTA = ["delta_rule", "gated_delta_rule", "kda"]   # on common/fused_recurrent_delta.py, which imports
RECURRENT = ["linear_attn", "simple_gla", "gla", "rwkv6", *DELTA]   # common/fused_recurrent.py
CHUNKED = EVERY_OP   # every op has chunk kernels (chunk_state, dot)


@pytest.mark.parametrize("path,ops", [
    ("fla_kernels/ops/rwkv6/chunk.py", ["rwkv6"]),
    ("fla_kernels/ops/gsa/declaration.py", ["gsa"]),
    ("fla_kernels/ops/gla/__init__.py", ["gla"]),
    ("fla_kernels/ops/gsa/fused_recurrent.py", ["gsa"]),
    ("fla_kernels/ops/simple_gla/chunk.py", ["linear_attn", "simple_gla"]),
    ("fla_kernels/ops/simple_gla/fused_recurrent.py", ["simple_gla"]),
    ("fla_kernels/ops/linear_attn/fused_chunk.py", ["linear_attn"]),
    ("fla_kernels/ops/common/chunk_gated.py", ["gla", "rwkv6"]),
    ("fla_kernels/ops/common/fused_recurrent.py", RECURRENT),
    ("fla_kernels/ops/common/partials.py", RECURRENT),
    ("fla_kernels/ops/common/chunk_state.py", CHUNKED),
    ("fla_kernels/ops/common/dot.py", CHUNKED),
    ("fla_kernels/ops/common/fused_recurrent_delta.py", DELTA),
    ("fla_kernels/ops/common/chunk_delta.py", DELTA),
    ("fla_kernels/ops/common/chunk_pairs.py", DELTA),
    ("fla_kernels/ops/common/gate_grad.py", EVERY_OP),
    ("fla_kernels/ops/common/launch.py", EVERY_OP),
    ("fla_kernels/ops/common/tiles.py", EVERY_OP),
    ("fla_kernels/ops/common/__init__.py", EVERY_OP),
    ("fla_kernels/__init__.py", EVERY_OP),
    ("fla_kernels/utils.py", EVERY_OP),
    ("fla_kernels/precision.py", EVERY_OP),
    ("fla_kernels/layers/gated_slot_attention.py", ["gsa"]),
    ("fla_kernels/layers/linear_attention.py", ["linear_attn"]),
    ("fla_kernels/layers/cache.py", WITH_LAYERS),
    ("fla_kernels/layers/base.py", WITH_LAYERS),
    ("fla_kernels/ops/gone.py", EVERY_OP),
    ("fla_kernels/ops/gla/notes.txt", EVERY_OP),
    ("references/gla.py", ["gla"]),
    ("references/chunk_gated.py", ["gla", "rwkv6"]),
    ("references/simple_gla.py", ["linear_attn", "simple_gla"]),
    ("references/common.py", EVERY_OP),
    ("harness/tolerance.py", EVERY_OP),
    ("harness/runner.py", EVERY_OP),
    ("harness/checks/options.py", EVERY_OP),
    ("pyproject.toml", EVERY_OP),
    ("somewhere/new.py", EVERY_OP),
    ("README.md", []),
    ("tests/test_gsa.py", []),
    ("benchmarks/golden_time.py", []),
    ("reports/html.py", []),
    (".github/workflows/gate-gpu.yml", []),
    ("baselines/h100/gla.csv", []),
])
def test_each_path_selects_the_ops_it_can_change(path, ops):
    assert list(ops_for_path(path)[0]) == [op for op in OPS if op in ops]   # in registry order


def test_selection_keeps_registry_order_and_the_first_reason():
    selection = select_ops(["README.md", "fla_kernels/ops/gsa/chunk.py",
                            "fla_kernels/ops/simple_gla/chunk.py", "fla_kernels/ops/gla/__init__.py",
                            "fla_kernels/ops/gla/fused_chunk.py"])
    assert selection.ops == ("gla", "gsa", "linear_attn", "simple_gla")   # registry order
    assert selection.reasons["gla"] == "its kernels changed (fla_kernels/ops/gla/__init__.py)"
    assert selection.describe().endswith(
        "; linear_attn, simple_gla: its kernels import fla_kernels/ops/simple_gla/chunk.py")


def test_reasons_name_the_ops_own_code_and_what_imports_the_file():
    assert ops_for_path("references/simple_gla.py")[0] == {
        "linear_attn": "its references import references/simple_gla.py",
        "simple_gla": "its references changed (references/simple_gla.py)"}
    assert ops_for_path("fla_kernels/layers/base.py")[0]["gsa"] == (
        "its layer imports fla_kernels/layers/base.py")
    ops, why = ops_for_path("fla_kernels/ops/gone.py")
    assert set(ops.values()) == {"fla_kernels/ops/gone.py changed and is no module of this checkout "
                                 "(deleted, or not Python)"} and why == ""


def test_documentation_only_selects_nothing():
    selection = select_ops(["README.md", "tests/test_cli.py"])
    assert selection.ops == ()
    assert selection.describe() == "no changed file can change a kernel's numbers"


def test_tolerance_change_names_the_tolerance_table():
    assert select_ops(["harness/tolerance.py"]).reasons["rwkv6"] == (
        "the tolerance table changed (harness/tolerance.py)")


def _copy_of_the_code(root):
    for package in ("fla_kernels", "references"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_a_module_no_op_imports_selects_none_until_one_does(tmp_path):
    alone, used = _copy_of_the_code(tmp_path / "alone"), _copy_of_the_code(tmp_path / "used")
    new = "fla_kernels/ops/common/scan.py"
    for root in (alone, used):
        (root / new).write_text("from fla_kernels.utils import store_dtype\n")
    chunk = used / "fla_kernels/ops/simple_gla/chunk.py"
    chunk.write_text(chunk.read_text() + "\nfrom fla_kernels.ops.common.scan import store_dtype  # noqa\n")
    assert ops_for_path(new, alone) == ({}, f"no op's code imports it ({new})")
    assert list(ops_for_path(new, used)[0]) == ["linear_attn", "simple_gla"]
    assert ops_for_path(new, used)[1] == ""


def test_imports_resolve_relative_names_submodules_and_attributes(tmp_path):
    files = {
        "fla_kernels/__init__.py": "from fla_kernels.pkg import helper\n",
        "fla_kernels/utils.py": "",
        "fla_kernels/pkg/__init__.py": "from .sub import helper\n",
        "fla_kernels/pkg/sub.py": "def helper(): pass\n",
        "fla_kernels/pkg/other.py": "import os\nfrom . import sub\nfrom .. import utils\n",
        "fla_kernels/pkg/attr.py": "from fla_kernels.pkg import helper\nimport fla_kernels.utils as u\n",
        "fla_kernels/pkg/late.py": "def f():\n    from fla_kernels.pkg.sub import helper\n",
        "fla_kernels/pkg/broken.py": "from fla_kernels.utils import (\n",
        "references/__init__.py": "",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    imports = {name: set(module.imports) for name, module in import_graph(tmp_path).items()}
    assert imports == {
        "fla_kernels": {"fla_kernels.pkg"}, "fla_kernels.utils": set(),
        "fla_kernels.pkg": {"fla_kernels.pkg.sub"}, "fla_kernels.pkg.sub": set(),
        "fla_kernels.pkg.other": {"fla_kernels.pkg.sub", "fla_kernels.utils"},
        "fla_kernels.pkg.attr": {"fla_kernels.pkg", "fla_kernels.utils"},
        "fla_kernels.pkg.late": {"fla_kernels.pkg.sub"}, "references": set(),
        "fla_kernels.pkg.broken": set(imports)}   # a file that does not parse may import anything


def test_every_module_selects_exactly_the_ops_whose_code_imports_it():
    """Every module of fla_kernels against the import graph: the graph has each import its text
    names, and the module selects the ops that reach it from their own code through imports, or
    that run it as the package of a module they reach (its imports then not followed)."""
    graph = import_graph()
    reached = {}
    for op in OPS:
        todo, seen = list(set().union(*entry_modules(op).values())), set()
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += graph[name].imports
        reached[op] = seen | {p for name in seen for p in graph if name.startswith(p + ".")}
    paths = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "fla_kernels").rglob("*.py"))
    name_of = {module.path: name for name, module in graph.items()}
    assert set(paths) <= set(name_of)
    for path in paths:
        name = name_of[path]
        for written in re.findall(r"^\s*(?:from|import)\s+((?:fla_kernels|references)[\w.]*)",
                                  (ROOT / path).read_text(), re.M):
            assert any(m == written or m.startswith(written + ".") for m in graph[name].imports), (
                f"{path} imports {written}, which the graph misses")
        ops, why = ops_for_path(path)
        assert list(ops) == [op for op in OPS if name in reached[op]], path
        assert why == ("" if ops else f"no op's code imports it ({path})")


@pytest.mark.parametrize("op", list(OPS))
def test_every_file_whose_code_runs_selects_the_op(op):
    """Without trusting the import graph: every variant's forward and backward, the references and
    the layer run once under a profiler; each file of fla_kernels or references whose functions
    ran (Triton helpers included: the interpreter runs them as Python) must select the op."""
    spec = OPS[op]
    case = Case(op, "fp32", B=1, T=17, H=1, K=16, V=16, h0="grad", gate="normal", seed=0,
                **{s: 16 for s in spec.symbols})
    inputs = make_inputs(spec, case, "cpu")
    # imported before the profiler starts: a module's body runs once, under whichever op imports it first
    for target in [*spec.variants.values(), spec.reference_loop, spec.reference_chunked]:
        load_function(target)
    layer_class(spec)
    ran = set()

    def record(frame, event, arg):
        if event == "call":
            ran.add(frame.f_code.co_filename)

    sys.setprofile(record)
    try:
        for variant in spec.variants:
            run_implementation(spec.variant_fn(variant), spec, case, inputs)
        golden_and_baseline(spec, case, inputs)
        if spec.layer is not None:
            layer = build_layer(spec, case, "cpu", torch.float32)
            layer.kernel = load_function(spec.reference_chunked)   # the kernels ran above
            x = torch.randn(1, case.T, case.H * case.V)
            first, _, cache = layer(x[:, :9], use_cache=True)
            second, _, _ = layer(x[:, 9:], use_cache=True, past_key_values=cache)
            torch.cat([first, second], dim=1).sum().backward()
    finally:
        sys.setprofile(None)
    ours = {Path(f).resolve() for f in ran} & {p.resolve() for d in ("fla_kernels", "references")
                                              for p in (ROOT / d).rglob("*.py")}
    ours = sorted(p.relative_to(ROOT).as_posix() for p in ours)
    assert "fla_kernels/ops/common/launch.py" in ours and f"references/{op}.py" in ours
    assert spec.layer is None or f"{layer_class(spec).__module__.replace('.', '/')}.py" in ours
    assert [path for path in ours if op not in ops_for_path(path)[0]] == []


def _git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


def test_changed_files_come_from_git_including_uncommitted_and_new_files(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "README.md").write_text("a\n")
    (tmp_path / "fla_kernels" / "ops" / "gla").mkdir(parents=True)
    (tmp_path / "fla_kernels" / "ops" / "gla" / "chunk.py").write_text("x = 1\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "base")
    (tmp_path / "fla_kernels" / "ops" / "gla" / "chunk.py").write_text("x = 2\n")
    (tmp_path / "notes.md").write_text("new\n")
    assert sorted(changed_files("HEAD", tmp_path)) == ["fla_kernels/ops/gla/chunk.py", "notes.md"]
    assert select_ops(changed_files("HEAD", tmp_path)).ops == ("gla",)


def test_an_unknown_revision_is_one_sentence(tmp_path):
    _git(tmp_path, "init", "-q")
    with pytest.raises(ValueError, match="^git diff against 'nope' failed: "):
        changed_files("nope", tmp_path)
