"""A run folder is never lost or doubled: a sweep interrupted (Ctrl-C, or killed while writing)
and continued with --resume ends with the rows of one that ran through; an existing run is kept
unless --resume or --force says otherwise; every argument or filesystem problem is one line and
exit 2."""
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from harness import sweep
from harness.cli import main

GOOD = "chunk=tests.implementations:baseline_like"
ARGS = ["sweep", "--op", "rwkv6", "--dtype", "fp32", "--variant", "chunk", "--T", "1,20,65",
        "--B", "1", "--H", "1", "--K", "16", "--V", "16", "--h0", "grad", "--gate", "normal",
        "--checks", "inputs,segments,inference,options", "--no-golden-cache", "--quiet"]
KEY = ["case_id", "variant", "impl", "check", "tensor"]
VALUES = ["err", "rel", "rms_rel", "base_err", "floor", "bound", "ratio", "verdict", "message",
          "first_bad", "case_rows", "run_id"]


def sweep_into(out, *extra):
    return main(ARGS + ["--impl", GOOD, "--out", str(out), *extra])


def rows(out):
    return pd.read_csv(out / "results.csv", dtype=str, keep_default_na=False)


@pytest.fixture(scope="module")
def through(tmp_path_factory):
    """The rows of the sweep run without interruption."""
    out = tmp_path_factory.mktemp("through")
    assert sweep_into(out) == 0
    return rows(out)


def same_rows(got: pd.DataFrame, want: pd.DataFrame):
    assert not got.duplicated(KEY).any()
    assert list(got[KEY].itertuples(index=False)) == list(want[KEY].itertuples(index=False))
    pd.testing.assert_frame_equal(got[VALUES].drop(columns="run_id").reset_index(drop=True),
                                  want[VALUES].drop(columns="run_id").reset_index(drop=True))
    assert got["run_id"].nunique() == 1


def interrupt_at(monkeypatch, n):
    """Ctrl-C arrives while the n-th case (from 1) runs."""
    calls = []
    real = sweep.run_case

    def run_case(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(sweep, "run_case", run_case)


def test_ctrl_c_writes_the_reports_says_how_to_resume_and_resume_gives_the_uninterrupted_rows(
        through, tmp_path, monkeypatch, capsys):
    interrupt_at(monkeypatch, 3)
    assert sweep_into(tmp_path) == 130
    out = capsys.readouterr().out
    assert f"--resume --out {tmp_path}" in out and "1 of 3 cases not run" in out
    assert (tmp_path / "report.html").exists() and (tmp_path / "summary.md").exists()
    assert set(rows(tmp_path)["T"]) == {"1", "20"}
    monkeypatch.undo()
    assert sweep_into(tmp_path, "--resume") == 0
    same_rows(rows(tmp_path), through)


def test_a_real_sigint_ends_without_a_traceback(tmp_path):
    command = [sys.executable, "-m", "harness", *ARGS, "--impl", "chunk=tests.implementations:slow",
               "--checks", "none", "--out", str(tmp_path)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.time() + 120
    while time.time() < deadline and not (tmp_path / "results.csv").exists():
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "--resume --out" in out
    assert (tmp_path / "report.html").exists()


def cut(path, keep_bytes_from_end):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - keep_bytes_from_end])


def test_a_last_row_cut_in_half_runs_its_case_again_and_says_so(through, tmp_path, capsys):
    assert sweep_into(tmp_path) == 0
    cut(tmp_path / "results.csv", 60)
    capsys.readouterr()
    assert sweep_into(tmp_path, "--resume") == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "cut short" in line]
    assert len(said) == 1 and "rwkv6-fp32-B1-T65" in said[0]
    same_rows(rows(tmp_path), through)


def test_rows_lost_at_a_line_end_are_found_by_the_case_row_count(through, tmp_path):
    assert sweep_into(tmp_path) == 0
    lines = (tmp_path / "results.csv").read_text().splitlines(keepends=True)
    (tmp_path / "results.csv").write_text("".join(lines[:-3]))
    assert sweep_into(tmp_path, "--resume") == 0
    same_rows(rows(tmp_path), through)


def test_a_case_whose_only_row_was_cut_runs_again(tmp_path):
    args = ARGS + ["--impl", "chunk=tests.implementations:raises_in_forward", "--out", str(tmp_path)]
    assert main(args) == 1
    whole = rows(tmp_path)
    assert list(whole["case_rows"]) == ["1", "1", "1"]
    cut(tmp_path / "results.csv", len(whole["message"].iloc[-1]) + 40)
    assert main(args + ["--resume"]) == 1
    pd.testing.assert_frame_equal(rows(tmp_path)[KEY + ["verdict", "message"]], whole[KEY + ["verdict", "message"]])


def test_an_existing_run_is_kept_without_resume_or_force_and_force_replaces_it(through, tmp_path,
                                                                                 capsys):
    assert sweep_into(tmp_path) == 0
    capsys.readouterr()
    assert sweep_into(tmp_path) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds a run" in err and "--force" in err
    assert len(rows(tmp_path)) == len(through)
    assert sweep_into(tmp_path, "--force") == 0
    same_rows(rows(tmp_path), through)


@pytest.mark.parametrize("extra,needle", [
    (["--resume"], "--resume needs --out"),
    (["--resume", "--out", "{tmp}/nowhere"], "nothing to resume in"),
    (["--resume", "--force", "--out", "{tmp}"], "give one"),
    (["--out", "{tmp}/a_file"], "is a file, not a folder"),
    (["--out", "{tmp}/a_file/run"], "cannot write in"),
    (["--T", "1,,3", "--out", "{tmp}/r"], "has an empty item"),
])
def test_each_bad_argument_is_one_line_and_exit_2(tmp_path, capsys, extra, needle):
    (tmp_path / "a_file").write_text("x")
    argv = ["sweep", "--op", "rwkv6", "--impl", GOOD, "--quiet"] + [a.format(tmp=tmp_path) for a in extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_one_line_and_exit_2(tmp_path, capsys):
    tmp_path.chmod(0o500)
    try:
        assert main(["sweep", "--op", "rwkv6", "--impl", GOOD, "--out", str(tmp_path / "r")]) == 2
    finally:
        tmp_path.chmod(0o700)
    assert "cannot write in" in capsys.readouterr().err


def test_resuming_a_results_file_of_other_columns_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "results.csv").write_text("run_id,case_id,verdict\nr,c,PASS\n")
    assert sweep_into(tmp_path, "--resume") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a results file of this version" in err
    assert (tmp_path / "results.csv").read_text() == "run_id,case_id,verdict\nr,c,PASS\n"
