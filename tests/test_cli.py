"""The command line: usage errors exit 2 in one line, sweeps stream rows, exit 1 on a failing row."""
import csv
import os
import subprocess
import sys

import pytest

from harness.cli import main

GOOD = "chunk=tests.implementations:baseline_like"
SMALL = ["--preset", "smoke", "--variant", "chunk", "--quiet"]


# what follows `sweep --op rwkv6` -> what the one-line error says
BAD_SWEEP_OPTIONS = {
    "--dtype fp64": "unknown dtype", "--variant fused": "unknown variant", "--preset huge": "unknown preset",
    "--impl chunk=nomodule": "VARIANT=module:function", "--impl chunk": "VARIANT=module:function",
    "--impl other=a:b": "does not have", "--impl chunk=no_such_module_x:f": "cannot import",
    "--impl chunk=tests.implementations:nope": "no function", "--T 0": "positive", "--T a": "--T",
    "--gate medium": "unknown gate", "--checks speed": "unknown check 'speed'",
    "--varlen ragged": "unknown varlen 'ragged'", "--option normalize": "unknown option 'normalize' of rwkv6",
    "--dtype bf16-fp16gates": "unknown dtype",
}
USAGE_ERRORS = [("sweep --op nope", "unknown op 'nope'"), ("sweep", "--op"), ("", "command"),
                *((f"sweep --op rwkv6 {words}", needle) for words, needle in BAD_SWEEP_OPTIONS.items())]


@pytest.mark.parametrize("argv,needle", [pytest.param(line.split(), needle, id=line or "no arguments")
                                         for line, needle in USAGE_ERRORS])
def test_usage_errors_exit_2_with_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_list_shows_ops_variants_presets(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("rwkv6", "chunk", "fused_recurrent", "cpu", "gpu"):
        assert word in out


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_passing_sweep_exits_0_and_writes_csv_html_markdown(tmp_path, capsys):
    code = main(["sweep", "--op", "rwkv6", "--dtype", "fp32,bf16", "--impl", GOOD, "--out", str(tmp_path)] + SMALL)
    assert code == 0
    rows = _rows(tmp_path / "results.csv")
    assert len([r for r in rows if r["check"] == "golden"]) == 2 * 8
    assert {r["verdict"] for r in rows} == {"PASS"}
    assert {r["check"] for r in rows} == {"golden", "aggregate", "inputs", "determinism", "segments",
                                          "causality", "inference", "options", "layer"}
    assert {r["impl"] for r in rows} == {"tests.implementations:baseline_like"}
    assert (tmp_path / "report.html").stat().st_size > 0
    assert "PASS" in (tmp_path / "summary.md").read_text()
    assert "wall time" in capsys.readouterr().out


def test_failing_sweep_exits_1(tmp_path):
    bad = "chunk=tests.implementations:gate_grad_scaled"
    assert main(["sweep", "--op", "rwkv6", "--dtype", "bf16", "--impl", bad, "--out", str(tmp_path)] + SMALL) == 1
    failing = [r for r in _rows(tmp_path / "results.csv") if r["verdict"] == "FAIL"]
    in_layer = [r["tensor"] for r in failing if r["check"] == "layer"]
    assert in_layer and all(t.startswith("dw_proj.") for t in in_layer)  # the layer's gate weights
    assert [(r["check"], r["tensor"]) for r in failing if r["check"] != "layer"] == [
        ("golden", "dw"), ("aggregate", "dw (sum over t)"), ("segments", "dw"), ("options", "dw (no final state)"),
        ("options", "dw (final state not in the loss)"), ("options", "dw (initial state without gradient)")]


def test_checks_none_leaves_the_golden_rows_and_the_second_sweep_reads_stored_goldens(tmp_path, capsys):
    args = ["sweep", "--op", "rwkv6", "--dtype", "bf16", "--impl", GOOD, "--checks", "none",
            "--golden-cache", str(tmp_path / "goldens")] + SMALL
    assert main(args + ["--out", str(tmp_path / "a")]) == 0
    assert {r["check"] for r in _rows(tmp_path / "a" / "results.csv")} == {"golden", "aggregate"}
    assert "0 stored, 1 computed" in capsys.readouterr().out
    assert main(args + ["--out", str(tmp_path / "b")]) == 0
    assert "1 stored, 0 computed" in capsys.readouterr().out


def test_erroring_kernel_exits_1_and_keeps_the_message(tmp_path):
    bad = "chunk=tests.implementations:raises_in_forward"
    assert main(["sweep", "--op", "rwkv6", "--dtype", "fp32", "--impl", bad, "--out", str(tmp_path)] + SMALL) == 1
    (row,) = _rows(tmp_path / "results.csv")
    assert row["verdict"] == "ERROR" and "planted failure in forward" in row["message"]


def test_resume_skips_finished_cases(tmp_path):
    args = ["sweep", "--op", "rwkv6", "--dtype", "fp32", "--impl", GOOD, "--out", str(tmp_path)] + SMALL
    assert main(args + ["--T", "3"]) == 0
    first = _rows(tmp_path / "results.csv")
    assert main(args + ["--T", "3,5", "--resume"]) == 0
    second = _rows(tmp_path / "results.csv")
    assert second[:len(first)] == first
    added = {r["check"] for r in second[len(first):]}
    assert "golden" in added and "options" not in added  # the options check went to T=3
    assert {r["run_id"] for r in second} == {first[0]["run_id"]}


def test_module_entry_point_exits_2_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "harness", "sweep", "--op", "nope"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "harness: error: unknown op 'nope'; known ops: delta_rule, gated_delta_rule, gla, gsa, kda, linear_attn, rwkv6, simple_gla"


def test_checks_determinism_on_request_catches_a_nondeterministic_kernel(tmp_path):
    bad = "chunk=tests.implementations:nondeterministic"
    args = ["sweep", "--op", "rwkv6", "--dtype", "fp32", "--impl", bad, "--checks", "determinism",
            "--out", str(tmp_path)] + SMALL
    assert main(args) == 1
    (row,) = [r for r in _rows(tmp_path / "results.csv") if r["verdict"] != "PASS"]
    assert row["check"] == "determinism" and row["tensor"] == "o"


def test_an_interrupt_while_the_harness_loads_is_one_line_and_exit_130(tmp_path):
    """Ctrl-C (or `timeout -s INT`) that lands while torch and triton import: no traceback."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    stand_in = tmp_path / "fla_kernels"
    stand_in.mkdir()
    (stand_in / "__init__.py").write_text("raise KeyboardInterrupt\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{root}")
    out = subprocess.run([sys.executable, "-m", "harness", "list"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 130 and out.stderr == "harness: interrupted\n", out.stderr
