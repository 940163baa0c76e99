"""`python -m harness repro CASE --layer SET`: the standalone script of an upstream layer's check,
run without the harness beside a stand-in fla (tests/stand_in_layers.py), prints the sweep's rows
for that layer both ways: a correct layer passes every row, a planted mistake fails its own."""
import subprocess
import sys

import pandas as pd
import pytest

from harness.cli import main
from harness.layer_repro import write_layer_repro
from tests.test_repro import without_harness  # noqa: F401 (a fixture)
from tests.test_upstream_layers import layer_release, layer_rows  # noqa: F401 (layer_release: a fixture)

CASE = "gla-fp32-B2-T12-H1-K8-V8-h0_none-normal-s0"   # the case of test_upstream_layers.layer_rows


def run_script(path, env, release_dir, *args) -> tuple[int, dict, str]:
    """Exit status, {row: (verdict, err)} and the output of the script, the stand-in fla importable."""
    env = dict(env, PYTHONPATH=f"{release_dir}:{env['PYTHONPATH']}")
    done = subprocess.run([sys.executable, str(path), *args], env=env, cwd=path.parent, capture_output=True,
                          text=True, timeout=600)
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("row "))
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        *name, err, _, _, _, verdict = line.split()
        rows[" ".join(name).removeprefix("fla layer: ")] = (verdict, None if err == "-" else float(err))
    return done.returncode, rows, done.stdout + done.stderr


def assert_the_sweeps_rows(printed: dict, swept: dict, tmp_path):
    """The script's rows are the sweep's: the same names and verdicts, the same errors."""
    assert set(printed) == set(swept), set(printed) ^ set(swept)
    every = pd.read_csv(tmp_path / "out" / "results.csv", keep_default_na=False)
    errors = {t.removeprefix("fla layer: "): e for t, e in zip(every["tensor"], every["err"])
              if t.startswith("fla layer")}
    for name, (verdict, err) in printed.items():
        assert verdict == swept[name][0], (name, verdict, swept[name])
        if err is not None:
            assert err == pytest.approx(float(errors[name]), rel=1e-3), name


@pytest.mark.parametrize("layer_release", [None], indirect=True)
def test_a_correct_layer_passes_with_the_sweeps_rows(layer_release, tmp_path, without_harness):
    swept = layer_rows(tmp_path)
    path = write_layer_repro(CASE, tmp_path / "repro.py", "fla", variant="fused_recurrent")
    code, printed, output = run_script(path, without_harness, tmp_path)
    assert code == 0, output
    assert_the_sweeps_rows(printed, swept, tmp_path)
    assert all(verdict == "PASS" for verdict, _ in printed.values()), output
    assert f"PASS (rows: {len(printed)} PASS)" in output


@pytest.mark.parametrize("layer_release, failing, message", [
    ("state_stored_transposed", "float64 segments", "the layer loses or misplaces state between calls"),
    ("mask_ignored", "y (padded batch, sequence 1)", "> bound"),
    ("input_written", "x", "the layer wrote into its input"),
], indirect=["layer_release"])
def test_a_planted_layer_mistake_fails_its_own_row(layer_release, failing, message, tmp_path, without_harness):
    swept = layer_rows(tmp_path)
    path = write_layer_repro(CASE, tmp_path, "fla", variant="fused_recurrent")
    code, printed, output = run_script(path, without_harness, tmp_path)
    assert code == 1, output
    assert_the_sweeps_rows(printed, swept, tmp_path)
    assert {name for name, (verdict, _) in printed.items() if verdict != "PASS"} == {failing}, output
    assert f"fla layer: {failing}: " in output and message in output
    assert f"FAIL: fla layer: {failing}" in output


@pytest.mark.parametrize("layer_release", ["forward_only+state_stored_transposed"], indirect=True)
def test_forward_only_runs_the_forwards_rows(layer_release, tmp_path, without_harness):
    """A function without a backward: the script's --forward-only gives the sweep's forward rows,
    and the mistake in the layer's cache still fails."""
    swept = layer_rows(tmp_path)
    path = write_layer_repro(CASE, tmp_path, "fla", variant="fused_recurrent")
    code, printed, output = run_script(path, without_harness, tmp_path, "--forward-only")
    assert code == 1, output
    assert_the_sweeps_rows(printed, swept, tmp_path)
    assert printed["gradients"][0] == "SKIP" and printed["float64 segments"][0] == "FAIL", output


@pytest.mark.parametrize("case_id, set_name, message", [
    ("gla-fp32-B2-T12-H1-K8-V8-h0_none-normal-s0", "other", "op gla declares no layer of set 'other'; "
     "its layers' sets are fla"),
    ("gla-fp32-B2-T12-H1-K8-V8-h0_none-normal-s0-packed", "fla", "is not one the layer check runs"),
    ("gla-bf16-fp32gates-B2-T12-H1-K8-V8-h0_none-normal-s0", "fla", "is not one the layer check runs"),
])
def test_bad_requests_raise_before_anything_is_written(case_id, set_name, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        write_layer_repro(case_id, tmp_path / "repro.py", set_name)
    assert not (tmp_path / "repro.py").exists()


def test_the_cli_refuses_layer_with_impl_or_segments(tmp_path, capsys):
    for extra in (["--impl", "fla.ops.gla:chunk_gla"], ["--segments"]):
        assert main(["repro", CASE, "--layer", "fla", *extra, "--out", str(tmp_path / "r.py")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--layer runs the set's own layer" in err
    assert not (tmp_path / "r.py").exists()
