"""The checks registry: the runner runs what is registered (a check added there writes its rows
with nothing else changed), a check with a group runs once per group of a plan, and editing a
check does not touch the goldens' fingerprint."""
from dataclasses import replace

import harness.checks as checks
from harness import golden_cache
from harness.checks import Check, checks_per_case, registered
from harness.runner import run_case
from tests.planted import CPU, SPEC, case, impl


def test_every_registered_check_is_named_and_has_its_own_module():
    assert checks.EXTRA_CHECKS == ("inputs", "determinism", "segments", "causality", "packing", "inference",
                                   "options", "layer")
    for check in checks.REGISTRY:
        assert check.rows.__module__ == f"harness.checks.{check.name}"


def test_a_registered_check_runs_where_it_applies_and_nowhere_else(monkeypatch):
    def rows(ctx, i, execution):
        return [ctx.row(i, "probe", "o", verdict="FAIL" if execution.result["o"].isnan().any()
                        else "PASS", message=f"{ctx.case.T} steps")]

    probe = Check("probe", rows)
    monkeypatch.setattr(checks, "REGISTRY", checks.REGISTRY + (probe,))
    got = [r for r in run_case(SPEC, case(), [impl("baseline_like")], CPU, checks=("probe",))
           if r["check"] == "probe"]
    assert [(r["tensor"], r["verdict"], r["message"]) for r in got] == [("o", "PASS", "40 steps")]
    never = replace(probe, applies=lambda ctx, i: False)
    monkeypatch.setattr(checks, "REGISTRY", checks.REGISTRY[:-1] + (never,))
    assert not [r for r in run_case(SPEC, case(), [impl("baseline_like")], CPU, checks=("probe",))
                if r["check"] == "probe"]
    assert [c.name for c in registered(("probe", "no such check"))] == ["probe"]


def test_a_check_with_a_group_runs_on_the_first_case_of_each_group_with_T_above_one(monkeypatch):
    grouped = Check("grouped", lambda ctx, i, e: [], group=("dtype",))
    monkeypatch.setattr(checks, "REGISTRY", (grouped, checks.REGISTRY[0]))
    plan = [(None, case(dtype=d, T=t), None) for d, t in (("fp32", 1), ("fp32", 20), ("fp32", 40),
                                                          ("bf16", 40), ("bf16", 20))]
    assert checks_per_case(plan, ("inputs", "grouped")) == [
        ("inputs",), ("grouped", "inputs"), ("inputs",), ("grouped", "inputs"), ("inputs",)]


def test_the_goldens_fingerprint_leaves_the_checks_and_the_runner_out():
    fingerprinted = golden_cache.FINGERPRINTED
    assert not any(path.startswith(("harness/checks", "harness/runner")) for path in fingerprinted)
    assert set(fingerprinted) == {"harness/inputs.py", "harness/execution.py", "harness/goldens.py",
                                  "harness/packing.py", "harness/cases.py", "harness/declaration.py",
                                  "references"}
