"""A process that dies in a case (a compiler's SIGABRT, a driver's SIGSEGV, an os._exit) costs that
case only: it gets an ERROR row naming how the process ended, and every other case's rows are those
of an undisturbed run; the same after the whole process tree is killed and the run resumed by hand.
The sweeps run as `python -m harness sweep` in real processes, on the toy op (tests/toy_op.py)."""
import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from harness import supervisor
from harness.cli import main
from harness.gate import sweep_command
from harness.registry import EXTRA_DECLARATIONS, OPS, declaration_modules, load_declarations

DYING = "toy_decay-fp32-B1-T20-H1-K16-V16-h0_none-normal-s0"
ARGS = ["sweep", "--op", "toy_decay", "--dtype", "fp32", "--B", "1", "--H", "1", "--K", "16",
        "--V", "16", "--h0", "none", "--gate", "normal", "--checks", "none", "--no-golden-cache",
        "--quiet"]
KEY = ["case_id", "variant", "impl", "check", "tensor"]


def impl(name):
    return f"chunk=tests.toy_op:chunk_toy_decay_{name}_at_T20"


def sweep_args(name, out, T="5,20,33"):
    return [*ARGS, "--T", T, "--impl", impl(name), "--out", str(out)]


def env():
    return {**os.environ, EXTRA_DECLARATIONS: "tests.toy_op", "PYTHONUNBUFFERED": "1"}


def harness(args, **kwargs):
    return subprocess.run([sys.executable, "-m", "harness", *args], env=env(), capture_output=True,
                          text=True, timeout=120, **kwargs)


def rows(out):
    return pd.read_csv(out / "results.csv", dtype=str, keep_default_na=False)


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    """The rows of the same sweep without the case that dies, run in this process."""
    out = tmp_path_factory.mktemp("undisturbed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(EXTRA_DECLARATIONS, "tests.toy_op")
        mp.setitem(OPS, "toy_decay", load_declarations(declaration_modules())["toy_decay"])
        assert main(sweep_args("aborting", out, T="5,33")) == 0
    return rows(out)


def the_rest_as_undisturbed(got, want, name, cause):
    """Every case but the dying one as the undisturbed run has it; the dying one one ERROR row
    for the implementation that ran, naming how the process ended; nothing twice."""
    assert not got.duplicated(KEY).any()
    rest = got[got["case_id"] != DYING].reset_index(drop=True)
    columns = ["case_id", "variant", "check", "tensor", "verdict", "err", "bound", "case_rows"]
    pd.testing.assert_frame_equal(rest[columns], want[columns].reset_index(drop=True))
    died = got[got["case_id"] == DYING]
    assert list(died[["variant", "impl", "verdict", "case_rows"]].itertuples(index=False)) == [
        ("chunk", impl(name).split("=")[1], "ERROR", "1")]
    message = died["message"].iloc[0]
    assert message.startswith(f"the sweep process died during this case ({cause}"), message
    assert f"during chunk ({impl(name).split('=')[1]}): its run" in message
    assert "the sweep went on in a new process" in message
    assert got["run_id"].nunique() == 1


@pytest.mark.parametrize("name,cause", [("aborting", "killed by SIGABRT"),
                                        ("segfaulting", "killed by SIGSEGV"),
                                        ("exiting", "exit code 0")])
def test_a_case_that_kills_its_process_is_an_error_row_and_the_sweep_goes_on(
        undisturbed, tmp_path, name, cause):
    done = harness(sweep_args(name, tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count(f"the sweep process died during case {DYING} ({cause}") == 1
    the_rest_as_undisturbed(rows(tmp_path), undisturbed, name, cause)
    assert not (tmp_path / supervisor.MARKER).exists()


def wait_for_marker(folder, case_id, deadline=60):
    """The marker once it says the case's implementation is running."""
    end = time.time() + deadline
    while time.time() < end:
        marker = supervisor.read_marker(folder)
        if marker and marker["case_id"] == case_id and "its run" in marker.get("step", ""):
            return marker
        time.sleep(0.1)
    raise AssertionError(f"case {case_id} never ran")


def test_a_run_killed_whole_mid_case_and_resumed_by_hand_gives_the_same(undisturbed, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "harness", *sweep_args("hanging", tmp_path)],
                            env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        marker = wait_for_marker(tmp_path, DYING)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert marker["variant"] == "chunk" and "died" not in marker
    assert set(rows(tmp_path)["T"]) == {"5"}
    done = harness([*sweep_args("hanging", tmp_path), "--resume"])
    assert done.returncode == 1, done.stdout + done.stderr
    the_rest_as_undisturbed(rows(tmp_path), undisturbed, "hanging", "how is not recorded")
    assert not (tmp_path / supervisor.MARKER).exists()


def test_a_case_deaf_to_a_stop_then_killed_whole_runs_again_on_resume(undisturbed, tmp_path):
    """`timeout -k`: SIGINT to the process tree, SIGKILL when a worker deaf to it (inside a long
    compile) has not ended. The case did not end its process, so the resumed run runs it again
    (no ERROR row) and ends with the rows of a run never stopped."""
    deaf = tmp_path.parent / f"{tmp_path.name}.deaf"
    proc = subprocess.Popen([sys.executable, "-m", "harness", *sweep_args("deaf", tmp_path)],
                            env={**env(), "TOY_DEAF": str(deaf)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_marker(tmp_path, DYING)
        end = time.time() + 60
        while not deaf.exists() and time.time() < end:   # the stop must come once the worker is deaf
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        end = time.time() + 30
        while not (tmp_path / supervisor.STOPPED).exists() and time.time() < end:
            time.sleep(0.1)
        assert proc.poll() is None, "the deaf worker ended on SIGINT"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert supervisor.read_marker(tmp_path)["stopped"] == "SIGINT"
    done = harness([*sweep_args("deaf", tmp_path), "--resume"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"case {DYING} was under way when the sweep was stopped (SIGINT)" in done.stdout
    got = rows(tmp_path)
    assert not got.duplicated(KEY).any() and got["run_id"].nunique() == 1
    assert set(got["verdict"]) == {"PASS"} and set(got["T"]) == {"5", "20", "33"}
    columns = ["case_id", "variant", "check", "tensor", "verdict", "err", "bound", "case_rows"]
    rest = got[got["case_id"] != DYING].reset_index(drop=True)
    pd.testing.assert_frame_equal(rest[columns], undisturbed[columns].reset_index(drop=True))
    assert not (tmp_path / supervisor.MARKER).exists() and not (tmp_path / supervisor.STOPPED).exists()


def test_ctrl_c_at_a_terminal_reaches_both_processes_and_interrupts_once(tmp_path):
    """The terminal sends SIGINT to the supervisor and its worker, and the supervisor passes it on:
    still one interruption, its reports written, exit 130."""
    proc = subprocess.Popen([sys.executable, "-m", "harness", *sweep_args("hanging", tmp_path)],
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_for_marker(tmp_path, DYING)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "--resume --out" in out
    assert (tmp_path / "report.html").exists() and not (tmp_path / supervisor.MARKER).exists()
    assert not (tmp_path / supervisor.STOPPED).exists()
    assert set(rows(tmp_path)["T"]) == {"5"}


def test_the_same_case_dying_again_is_not_restarted_forever(tmp_path, monkeypatch):
    """A marker the resumed worker leaves again (it died before writing the ERROR rows) stops the
    sweep with the resume command, exit 128 + the signal."""
    calls = []

    def dies(args, env):
        calls.append(args)
        (tmp_path / "results.csv").write_text("")
        with open(env[supervisor.WORKER], "w") as note:
            note.write(str(tmp_path))
        (tmp_path / supervisor.MARKER).write_text(json.dumps({"case_id": "c", "step": "s"}))
        return -signal.SIGABRT, None

    monkeypatch.setattr(supervisor, "_run_worker", dies)
    said = []
    code = supervisor.supervise(["sweep", "--op", "x", "--force"], echo=lambda *a, **k: said.append(a[0]))
    assert code == 128 + signal.SIGABRT
    assert calls == [["sweep", "--op", "x", "--force"],
                     ["sweep", "--op", "x", "--resume", "--out", str(tmp_path)]]
    assert "going on in a new process" in said[0] and "continue with" in said[1]


def test_the_gates_sweeps_run_supervised():
    command = sweep_command("toy_decay", {"T": [1]}, "out")
    assert command[:3] == [sys.executable, "-m", "harness"]
    assert supervisor.supervised(command[3:])
