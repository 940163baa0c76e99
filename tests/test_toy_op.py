"""A new op from one declaration (tests/toy_op.py) runs through the registry, every check, the CLI,
repro and the gate, without a line of the harness naming it; and a planted bug in it fails."""
import dataclasses
import json

import pandas as pd
import pytest
import torch

from fla_kernels.utils import interpreting
from harness.cases import Case
from harness.cli import main
from harness.declaration import load_function
from harness.registry import EXTRA_DECLARATIONS, OPS, declaration_modules, load_declarations
from harness.runner import Implementation, run_case
from tests import toy_op
from tests.kernel_testing import DEVICE

CASE = Case(op="toy_decay", dtype="bf16", B=1, T=20, H=2, K=16, V=16, h0="grad", gate="normal", seed=0)
SUITE = {"preset": "cpu", "dtype": ["bf16"], "T": [1, 20], "K": [16], "V": [16], "gate": ["normal"],
         "h0": ["grad"]}


@pytest.fixture
def toy(monkeypatch):
    """The toy op registered as the environment variable registers it, here and in subprocesses."""
    monkeypatch.setenv(EXTRA_DECLARATIONS, "tests.toy_op")
    spec = load_declarations(declaration_modules())["toy_decay"]
    monkeypatch.setitem(OPS, spec.name, spec)
    return spec


def test_the_registry_takes_a_declaration_named_in_the_environment(toy):
    assert toy.declared_in == "tests.toy_op" and toy.variants == toy_op.OP.variants
    assert set(OPS) >= {"gla", "gsa", "linear_attn", "rwkv6", "simple_gla", "toy_decay"}


def test_a_module_without_a_declaration_is_one_sentence():
    with pytest.raises(ValueError, match="op declaration module 'tests.kernel_testing' does not give an OP"):
        load_declarations(["tests.kernel_testing"])
    with pytest.raises(ValueError, match="op 'toy_decay' is declared twice"):
        load_declarations(["tests.toy_op", "tests.toy_op"])


def test_every_check_runs_on_the_toy_op_and_passes(toy):
    impls = [Implementation(v, "ours", toy.variant_fn(v)) for v in toy.variants]
    rows = run_case(toy, CASE, impls, torch.device(DEVICE))
    expected = {"golden", "aggregate", "agreement", "inputs", "segments", "causality", "inference", "options"}
    expected |= set() if interpreting() else {"determinism"}   # the interpreter runs serially
    assert {r["check"] for r in rows} == expected
    assert {r["tensor"] for r in rows if r["check"] == "golden"} == {"o", "ht", "dq", "dk", "dv", "dh0"}
    assert all(r["verdict"] == "PASS" for r in rows), [(r["variant"], r["check"], r["tensor"], r["message"])
                                                      for r in rows if r["verdict"] != "PASS"]


def test_a_decay_one_bf16_rounding_off_fails_on_the_float32_final_state(toy):
    """bf16 outputs hide a decay 2^-8 too weak under their own rounding; the float32 state does not."""
    wrong = Implementation("chunk", "ours", load_function("tests.toy_op:chunk_toy_decay_wrong_gamma"))
    rows = run_case(toy, dataclasses.replace(CASE, T=65), [wrong], torch.device(DEVICE), checks=[])
    failed = {r["tensor"] for r in rows if r["verdict"] == "FAIL"}
    assert "ht" in failed and "o" not in failed, failed
    assert all("> bound" in r["message"] for r in rows if r["verdict"] == "FAIL" and r["check"] == "golden")


def test_the_cli_sweeps_lists_and_reproduces_the_toy_op(toy, tmp_path, capsys):
    assert main(["list"]) == 0 and "toy_decay: S_t = exp(-1/8)" in capsys.readouterr().out
    assert main(["sweep", "--op", "toy_decay", "--preset", "smoke", "--out", str(tmp_path / "s"),
                 "--no-golden-cache"]) == 0
    rows = pd.read_csv(tmp_path / "s" / "results.csv")
    assert set(rows["op"]) == {"toy_decay"} and (rows["verdict"] == "PASS").all()
    script = tmp_path / "repro.py"
    assert main(["repro", rows["case_id"].iloc[0], "--out", str(script)]) == 0
    assert "toy_decay_recurrent" in script.read_text()


def test_the_gate_writes_the_toy_ops_baseline_and_passes_it_unchanged(toy, tmp_path):
    (tmp_path / "gate.json").write_text(json.dumps({"growth_factor": 2.0, "ratio_floor": 0.05,
                                                    "noise_roundings": 4, "suites": {"cpu": SUITE}}))
    common = ["gate", "--op", "toy_decay", "--baseline-dir", str(tmp_path), "--device-class", "cpu"]
    assert main([*common, "--update-baseline", "--out", str(tmp_path / "first")]) == 0
    baseline = pd.read_csv(tmp_path / "cpu" / "toy_decay.csv")
    assert set(baseline["T"]) == {1, 20} and (baseline["verdict"] == "PASS").all()
    summary = tmp_path / "summary.md"
    assert main([*common, "--out", str(tmp_path / "second"), "--summary", str(summary)]) == 0
    text = summary.read_text()
    assert "**PASS**" in text.splitlines()[0] and f"{len(baseline)} same" in text, text


def test_an_option_reaches_the_reference_and_the_kernels_and_is_checked_both_ways(toy):
    """The toy op's option (decay_scale=2.0, a keyword of its calls) as a case of its own, as rows of
    the options check on a core case, and as a SKIP for an implementation without the keyword."""
    impls = [Implementation(v, "ours", toy.variant_fn(v)) for v in toy.variants]
    faster = dataclasses.replace(CASE, option="faster")
    rows = run_case(toy, faster, impls, torch.device(DEVICE), checks=["segments"])
    assert rows and all(r["verdict"] == "PASS" and r["option"] == "faster" for r in rows)
    assert {r["check"] for r in rows} >= {"golden", "segments"}
    core = run_case(toy, CASE, impls[:1], torch.device(DEVICE), checks=["options"])
    labelled = {r["tensor"] for r in core if r["check"] == "options" and r["tensor"].endswith("(faster)")}
    assert labelled == {"o (faster)", "ht (faster)", "dq (faster)", "dk (faster)", "dv (faster)", "dh0 (faster)"}
    assert all(r["verdict"] == "PASS" and r["case_id"] == CASE.case_id for r in core)
    plain = Implementation("chunk", "tests.toy_op:chunk_toy_decay_without_options",
                           toy_op.chunk_toy_decay_without_options)
    skipped = run_case(toy, faster, [plain], torch.device(DEVICE), checks=[])
    assert [(r["verdict"], r["message"]) for r in skipped] == [
        ("SKIP", "the implementation does not take decay_scale, which this case needs")]
    skipped = [r for r in run_case(toy, CASE, [plain], torch.device(DEVICE), checks=["options"])
               if r["verdict"] == "SKIP"]
    assert [r["message"] for r in skipped] == [
        "with faster: the implementation does not take decay_scale, which this case needs"]


def test_an_option_the_sweep_asks_for_runs_where_declared_and_is_a_usage_error_elsewhere(toy, tmp_path):
    assert main(["sweep", "--op", "gla", "--option", "faster", "--preset", "smoke", "--out", str(tmp_path / "x")]) == 2
    assert main(["sweep", "--op", "toy_decay", "--option", "none,faster", "--preset", "smoke",
                 "--checks", "none", "--out", str(tmp_path / "s"), "--no-golden-cache"]) == 0
    rows = pd.read_csv(tmp_path / "s" / "results.csv")
    assert set(rows["option"]) == {"none", "faster"} and (rows["verdict"] == "PASS").all()
