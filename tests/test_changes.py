"""Change-aware selection: a changed file selects the ops whose numbers it can move, no fewer."""
import subprocess

import pytest

from harness.changes import changed_files, ops_for_path, select_ops
from harness.registry import OPS

EVERY_OP = list(OPS)


@pytest.mark.parametrize("path,ops", [
    ("fla_kernels/ops/rwkv6/chunk.py", ["rwkv6"]),
    ("fla_kernels/ops/gsa/fused_recurrent.py", ["gsa"]),
    ("fla_kernels/layers/gated_slot_attention.py", ["gsa"]),
    ("fla_kernels/layers/linear_attention.py", ["linear_attn"]),
    ("fla_kernels/ops/common/chunk_gated.py", EVERY_OP),
    ("fla_kernels/layers/cache.py", EVERY_OP),
    ("fla_kernels/utils.py", EVERY_OP),
    ("harness/tolerance.py", EVERY_OP),
    ("harness/runner.py", EVERY_OP),
    ("references/gla.py", EVERY_OP),
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
    assert ops_for_path(path)[0] == ops


def test_selection_keeps_registry_order_and_the_first_reason():
    selection = select_ops(["README.md", "fla_kernels/ops/gsa/chunk.py", "fla_kernels/ops/gla/chunk.py",
                            "fla_kernels/ops/gla/fused_chunk.py"])
    assert selection.ops == ("gla", "gsa")
    assert selection.reasons["gla"] == "its kernels changed (fla_kernels/ops/gla/chunk.py)"
    assert "gla: its kernels changed" in selection.describe()


def test_documentation_only_selects_nothing():
    selection = select_ops(["README.md", "tests/test_cli.py"])
    assert selection.ops == ()
    assert selection.describe() == "no changed file can change a kernel's numbers"


def test_tolerance_change_names_the_tolerance_table():
    assert select_ops(["harness/tolerance.py"]).reasons["rwkv6"] == (
        "the tolerance table changed (harness/tolerance.py)")


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
