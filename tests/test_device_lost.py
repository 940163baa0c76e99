"""A kernel that kills the GPU context (an illegal or misaligned memory access is sticky: every later
CUDA call in the process fails) costs its own case, not the sweep: the rows up to the failure and an
ERROR row saying what happened are written, and the sweep goes on in a new process with --resume.
The context's death is simulated on CPU by the health probe run_sweep takes."""
import subprocess
import sys

import pandas as pd
import pytest
import torch

from harness import cli
from harness.runner import Implementation, run_case
from harness.sweep import DeviceLost, run_sweep
from tests.planted import SPEC, case, impl


class BrokenContext:
    """An implementation that raises a CUDA-style error on one case and leaves the probe failing
    from then on (a new instance stands for a new process)."""

    def __init__(self, at_T: int, escapes=False):
        self.at_T, self.escapes, self.dead = at_T, escapes, False
        self.inner = impl("baseline_like").fn

    def fn(self, r, *args, **kwargs):
        if self.dead or r.shape[1] == self.at_T:
            self.dead = True
            raise RuntimeError("CUDA error: misaligned address")
        return self.inner(r, *args, **kwargs)

    def healthy(self, dev):
        return not self.dead


def plan_of(broken, Ts=(10, 20, 30)):
    impls = [Implementation("chunk", "planted", broken.fn)]
    return [(SPEC, case(T=T, h0="none"), impls) for T in Ts]


def test_the_case_that_lost_the_context_is_recorded_and_the_rest_run_after_a_restart(tmp_path):
    broken = BrokenContext(at_T=20)
    with pytest.raises(DeviceLost, match="lost in case rwkv6-fp32-B2-T20"):
        run_sweep(plan_of(broken), tmp_path, "run", progress=False, checks=(),
                  healthy=broken.healthy)
    rows = pd.read_csv(tmp_path / "results.csv")
    assert sorted(rows["T"].unique()) == [10, 20]
    assert (rows[rows["T"] == 10]["verdict"] == "PASS").all()
    lost = rows[rows["T"] == 20]
    assert list(lost["verdict"]) == ["ERROR", "ERROR"]
    assert lost["message"].iloc[0] == "RuntimeError: CUDA error: misaligned address"
    assert lost["message"].iloc[1].startswith(
        "the GPU context was lost during this case (RuntimeError: CUDA error: misaligned address)")

    fresh = BrokenContext(at_T=None)  # the new process: the context works again
    outcome = run_sweep(plan_of(fresh), tmp_path, "run2", resume=True, progress=False, checks=(),
                        healthy=fresh.healthy)
    assert (outcome.cases_run, outcome.cases_skipped) == (1, 2)
    rows = pd.read_csv(tmp_path / "results.csv")
    assert sorted(rows["T"].unique()) == [10, 20, 30]
    assert (rows[rows["T"] == 30]["verdict"] == "PASS").all()
    assert set(rows["run_id"]) == {"run"}


def test_an_error_that_escapes_the_case_is_recorded_for_each_implementation(tmp_path, monkeypatch):
    """The asynchronous error surfaced outside any guarded call (say, seeding the layer check)."""
    broken = BrokenContext(at_T=None)

    def dies(spec, case, impls, device, checks, cache, where):
        where["step"] = "chunk (planted): the layer check"
        broken.dead = True
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr("harness.sweep.run_case", dies)
    with pytest.raises(DeviceLost):
        run_sweep(plan_of(broken, Ts=(10,)), tmp_path, "run", progress=False, checks=(),
                  healthy=broken.healthy)
    rows = pd.read_csv(tmp_path / "results.csv")
    assert list(rows["verdict"]) == ["ERROR"]
    assert ("(RuntimeError: CUDA error: an illegal memory access was encountered, surfaced during "
            "chunk (planted): the layer check)") in rows["message"].iloc[0]


def test_the_case_names_the_step_under_way_when_an_error_escapes_it(monkeypatch):
    def raises(*args, **kwargs):
        raise RuntimeError("CUDA error: misaligned address")

    monkeypatch.setattr("harness.checks.layer.layer_rows", raises)
    where = {}
    with pytest.raises(RuntimeError):
        run_case(SPEC, case(T=20, h0="none"), [impl("baseline_like")], torch.device("cpu"),
                 ("inputs", "layer"), None, where)
    assert where["step"] == "chunk (tests.implementations:baseline_like): the layer check"


def test_an_ordinary_exception_outside_the_case_still_propagates(tmp_path, monkeypatch):
    """With the context healthy, a harness bug is not disguised as a lost GPU."""
    monkeypatch.setattr("harness.sweep.run_case", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run_sweep(plan_of(BrokenContext(at_T=None), Ts=(10,)), tmp_path, "run", progress=False,
                  checks=())


def test_the_cli_restarts_the_same_sweep_resuming_into_the_same_folder(tmp_path, monkeypatch):
    def lose(*args, **kwargs):
        raise DeviceLost("the GPU context was lost in case x: ...")

    calls = []

    def execv(exe, argv):  # the process would be replaced here
        calls.append((exe, argv))
        raise SystemExit(0)

    monkeypatch.setattr("harness.sweep.run_sweep", lose)
    monkeypatch.setattr(cli.os, "execv", execv)
    argv = ["sweep", "--op", "rwkv6", "--preset", "smoke", "--out", str(tmp_path), "--quiet"]
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert calls == [(sys.executable, [sys.executable, "-m", "harness", "sweep", "--op", "rwkv6",
                                       "--preset", "smoke", "--quiet", "--resume", "--out",
                                       str(tmp_path)])]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU whose context a kernel can kill")
@pytest.mark.parametrize("jobs,restart", [("1", "going on in a new process"),
                                          ("2", "a new worker takes its device")])
def test_a_kernel_that_kills_the_context_costs_only_its_case(tmp_path, jobs, restart):
    """On the GPU, end to end: the out-of-bounds store at T = 30 takes its case, and the sweep's
    new process (or, with workers, the worker that replaces the one that lost it) runs the rest."""
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "sweep", "--op", "rwkv6", "--variant", "chunk", "--impl",
         "chunk=tests.broken_triton:chunk_rwkv6_killing_the_context_at_T30", "--dtype", "fp32",
         "--T", "20,30,40", "--H", "1", "--K", "16", "--V", "16", "--h0", "none", "--gate", "normal",
         "--checks", "none", "--no-golden-cache", "--quiet", "--jobs", jobs, "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert restart in done.stdout
    rows = pd.read_csv(out / "results.csv")
    assert sorted(rows["T"].unique()) == [20, 30, 40]
    assert (rows[rows["T"] != 30]["verdict"] == "PASS").all()
    lost = rows[rows["T"] == 30]
    assert (lost["verdict"] == "ERROR").any() and lost["message"].str.contains("context was lost").any()
