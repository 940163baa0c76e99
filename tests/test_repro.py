"""`python -m harness repro`: case ids parse back into cases, and the standalone script it writes
rebuilds the case's inputs bit for bit and, run without the harness, gives the sweep's numbers and
verdicts both ways: a correct implementation passes, planted bugs fail on the sweep's tensors."""
import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.cases import GATES, H0_OPTIONS, Case
from harness.checks.bits import bitwise_equal
from harness.environment import device as default_device
from harness.inputs import make_inputs
from harness.declaration import load_function
from harness.registry import OPS, get_op
from harness.repro import parse_case_id, write_repro
from harness.runner import Implementation, run_case

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")
ONE_CASE = "rwkv6-bf16-B2-T40-H2-K8-V6-h0_grad-normal-s1"
NO_INITIAL_STATE = "rwkv6-bf16-B2-T40-H2-K8-V6-h0_none-normal-s1"


def implementation(name: str) -> str:
    return f"tests.implementations:{name}"


@pytest.fixture(scope="module")
def without_harness(tmp_path_factory) -> dict:
    """An environment whose PYTHONPATH puts a `harness` that refuses to import before the repository."""
    stub = tmp_path_factory.mktemp("no_harness")
    (stub / "harness").mkdir()
    (stub / "harness" / "__init__.py").write_text('raise ImportError("the script imported the harness")\n')
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(stub), str(ROOT)]))


def run_script(path: Path, env: dict) -> tuple[int, dict, str]:
    """Exit status, {tensor: printed numbers and verdict}, and the output of `python path`."""
    done = subprocess.run([sys.executable, str(path)], env=env, cwd=path.parent, capture_output=True,
                          text=True, timeout=300)
    return done.returncode, printed_table(done.stdout), done.stdout + done.stderr


def printed_table(stdout: str) -> dict:
    """The script's aligned lines, from the header to the first blank line."""
    lines = stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("tensor ")), len(lines))
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        words = line.split()
        rows[words[0]] = {"err": float(words[1]), "base_err": float(words[2]), "floor": float(words[3]),
                          "bound": float(words[4]), "verdict": words[-1]}
    return rows


def harness_rows(case_id: str, target: str, check: str = "golden", variant: str = "chunk") -> dict:
    """{tensor: row} of run_case's `check` for the same case, `target` in place of `variant`, on
    the device a script picks by default."""
    case = parse_case_id(case_id)
    impl = Implementation(variant, target, load_function(target))
    checks = () if check == "golden" else (check,)
    return {r["tensor"]: r for r in run_case(get_op(case.op), case, [impl], default_device(),
                                             checks=checks)
            if r["check"] == check}


def assert_same_as_harness(printed: dict, rows: dict):
    assert set(printed) == set(rows)
    for name, row in rows.items():
        assert printed[name]["verdict"] == row["verdict"], name
        for key in ("err", "base_err", "floor", "bound"):
            assert printed[name][key] == pytest.approx(row[key], rel=1e-3), (name, key)


def load_script(path: Path, monkeypatch):
    """The generated script as a module, without running its main block."""
    name = f"repro_script_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)   # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_case_ids_round_trip():
    seeds = (0, 7, 12345, -3)
    for op, M, h0, gate, seed in itertools.product(OPS, (0, 16), H0_OPTIONS, GATES, seeds):
        case = Case(op=op, dtype="bf16", B=2, T=43884, H=4, K=60, V=100, h0=h0, gate=gate, seed=seed, M=M)
        assert parse_case_id(case.case_id) == case


@pytest.mark.parametrize("case_id", [
    "",
    "rwkv6",
    "rwkv6-bf16-B1-T65-H2-K16-V16-h0_grad-normal",         # no seed
    "rwkv6-bf8-B1-T65-H2-K16-V16-h0_grad-normal-s0",       # unknown dtype
    "rwkv6-bf16-B1-T65-H2-K16-V16-h0_maybe-normal-s0",     # unknown initial-state option
    "rwkv6-bf16-B1-T65-H2-K16-V16-h0_grad-gentle-s0",      # unknown gate
    "gsa-bf16-B1-T65-H2-K16-V16-M0-h0_grad-normal-s0",     # M=0 is written without -M
    "rwkv6-bf16-B0-T65-H2-K16-V16-h0_grad-normal-s0",
    "rwkv6-bf16-B1-T065-H2-K16-V16-h0_grad-normal-s0",
    "rwkv6-bf16-B1-T65-H2-K16-V16-h0_grad-normal-sX",
    "rwkv6-bf16-B1-T65-H2-K16-V16-h0_grad-normal-s0.py",
    "rwkv6-bf16-b1-T65-H2-K16-V16-h0_grad-normal-s0",
])
def test_malformed_case_ids_raise_one_sentence(case_id):
    with pytest.raises(ValueError) as raised:
        parse_case_id(case_id)
    message = str(raised.value)
    assert f"'{case_id}'" in message and "\n" not in message and message.endswith(".")


@pytest.mark.parametrize("case_id, options", [
    ("mamba-bf16-B1-T20-H1-K8-V8-h0_grad-normal-s0", {}),
    (ONE_CASE, {"variant": "fused_chunk"}),
    (ONE_CASE, {"target": "tests.implementations:no_such_function"}),
    (ONE_CASE, {"target": "no_such_package.kernels:chunk_rwkv6"}),
    ("rwkv6-bf16-B1-T1-H1-K8-V8-h0_grad-normal-s0", {"segments": True}),
    ("gsa-bf16-B1-T20-H1-K8-V8-h0_grad-normal-s0", {}),
    ("rwkv6-bf16-B1-T20-H1-K8-V8-M8-h0_grad-normal-s0", {}),
    (ONE_CASE, {"device": "gpu:zero"}),
])
def test_bad_requests_raise_before_anything_is_written(case_id, options, tmp_path):
    with pytest.raises(ValueError) as raised:
        write_repro(case_id, tmp_path / "repro.py", **options)
    assert "\n" not in str(raised.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("case_id", [
    "rwkv6-bf16-B2-T20-H2-K8-V6-h0_grad-normal-s0",
    "gla-fp16-B1-T33-H2-K12-V8-h0_random-strong-s12",
    "gsa-bf16-B1-T17-H1-K8-V8-M16-h0_grad-weak-s3",
    "simple_gla-fp32-B2-T9-H3-K8-V16-h0_none-normal-s305",
])
def test_script_rebuilds_the_inputs_bit_for_bit(case_id, tmp_path, monkeypatch):
    case = parse_case_id(case_id)
    script = load_script(write_repro(case_id, tmp_path, device="cpu"), monkeypatch)
    ours, theirs = script.make_inputs(script.SPEC, script.CASE, "cpu"), make_inputs(get_op(case.op), case, CPU)
    assert list(ours.tensors) == list(theirs.tensors)
    pairs = list(zip(ours.tensors.values(), theirs.tensors.values())) + [(ours.do, theirs.do)]
    pairs += list(zip(ours.dhts, theirs.dhts, strict=True))
    if case.h0 == "none":
        assert ours.initial_states is None and theirs.initial_states is None
    else:
        pairs += list(zip(ours.initial_states, theirs.initial_states, strict=True))
    assert all(bitwise_equal(a, b) for a, b in pairs)


@pytest.mark.parametrize("case_id, options", [
    ("gsa-bf16-B1-T17-H1-K8-V8-M16-h0_grad-weak-s3", {"segments": True, "variant": "fused_recurrent"}),
    (ONE_CASE, {"target": implementation("baseline_like")}),
])
def test_script_imports_no_harness_and_names_nothing_undefined(case_id, options, tmp_path):
    pyflakes_api = pytest.importorskip("pyflakes.api")
    reporter = pytest.importorskip("pyflakes.reporter")
    path = write_repro(case_id, tmp_path, **options)
    text = path.read_text()
    assert not [line for line in text.splitlines() if line.startswith(("import harness", "from harness"))]
    found = []

    class Collect(reporter.Reporter):
        def __init__(self):
            super().__init__(None, None)

        def flake(self, message):
            found.append(str(message))

        def syntaxError(self, *args):
            found.append(f"syntax error {args}")

    pyflakes_api.check(text, str(path), Collect())
    assert not found
    # a function not ours may be upstream's, autotuned: the script readies the interpreter for it
    assert ("\nprepare()\n" in text) == ("target" in options)


def test_the_stub_makes_the_harness_unimportable(without_harness, tmp_path):
    done = subprocess.run([sys.executable, "-c", "import harness"], env=without_harness, cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode != 0 and "the script imported the harness" in done.stderr


def test_correct_implementation_passes_with_the_sweeps_numbers(tmp_path, without_harness):
    target = implementation("baseline_like")
    code, printed, output = run_script(write_repro(ONE_CASE, tmp_path, target=target), without_harness)
    assert code == 0, output
    assert_same_as_harness(printed, harness_rows(ONE_CASE, target))
    assert {row["verdict"] for row in printed.values()} == {"PASS"}


def test_planted_gate_gradient_bug_fails_on_dw_only(tmp_path, without_harness):
    target = implementation("gate_grad_scaled")
    code, printed, output = run_script(write_repro(ONE_CASE, tmp_path, target=target), without_harness)
    assert code == 1, output
    assert [name for name, row in printed.items() if row["verdict"] == "FAIL"] == ["dw"]
    assert "dw: err " in output and "> bound" in output
    assert_same_as_harness(printed, harness_rows(ONE_CASE, target))


def test_segments_catch_a_kernel_that_ignores_its_initial_state(tmp_path, without_harness):
    """Without an initial state one call is right; the second of two segments starts from zero."""
    target = implementation("ignores_initial_state")
    code, _, output = run_script(write_repro(NO_INITIAL_STATE, tmp_path, target=target), without_harness)
    assert code == 0, output
    path = write_repro(NO_INITIAL_STATE, tmp_path, target=target, segments=True)
    code, printed, output = run_script(path, without_harness)
    assert code == 1, output
    assert printed["o"]["verdict"] == "FAIL"
    assert_same_as_harness(printed, harness_rows(NO_INITIAL_STATE, target, "segments"))


def test_our_kernel_over_segments_with_two_states_matches_the_sweep(tmp_path, without_harness):
    """A registered Triton variant (imported from fla_kernels; interpreted on CPU), gsa's two states."""
    case_id = "gsa-bf16-B1-T20-H1-K8-V8-M8-h0_grad-normal-s0"
    path = write_repro(case_id, tmp_path, variant="fused_recurrent", segments=True)
    code, printed, output = run_script(path, without_harness)
    assert code == 0, output
    target = get_op("gsa").variants["fused_recurrent"]
    assert_same_as_harness(printed, harness_rows(case_id, target, "segments", "fused_recurrent"))


def test_a_case_too_large_for_a_whole_golden_is_compared_on_the_sweeps_sample(tmp_path, without_harness,
                                                                               monkeypatch):
    """Past GOLDEN_LIMIT the script compares on the sample the sweep takes, with its numbers; a
    parameter shared by every row is left out, where the sweep has a SKIP row."""
    from harness import sampling
    monkeypatch.setattr(sampling, "GOLDEN_LIMIT", 100)
    target = implementation("baseline_like")
    code, printed, output = run_script(write_repro(ONE_CASE, tmp_path, target=target), without_harness)
    assert code == 0, output
    assert "golden on a sample: batch rows 0, 1 at head 1" in output and "no golden for du" in output
    rows = harness_rows(ONE_CASE, target)
    assert rows.pop("du")["verdict"] == "SKIP"
    assert_same_as_harness(printed, rows)


def test_a_function_that_raises_is_one_error_line_and_exit_1(tmp_path, without_harness):
    code, printed, output = run_script(write_repro(ONE_CASE, tmp_path, target=implementation("raises_in_forward")),
                                       without_harness)
    assert code == 1 and printed == {}, output
    assert "\nERROR: RuntimeError: planted failure in forward\n" in output, output


def test_a_lost_gpu_context_stops_the_script_before_the_golden(tmp_path, monkeypatch, capsys):
    """A kernel's illegal memory access kills the CUDA context for the process: the script prints
    the call's ERROR line and why nothing more runs, and exits 1 without the golden (whose CUDA
    calls would raise a traceback of their own)."""
    script = load_script(write_repro(ONE_CASE, tmp_path, target=implementation("raises_in_forward")), monkeypatch)
    monkeypatch.setattr(script, "device_healthy", lambda device: False)

    def no_golden(inputs):
        raise AssertionError("the golden ran on a lost context")

    monkeypatch.setattr(script, "golden_and_baseline_of_case", no_golden)
    assert script.main() == 1
    output = capsys.readouterr().out
    assert "\nERROR: RuntimeError: planted failure in forward\n" in output
    assert "The GPU context is lost" in output


def test_a_healthy_context_goes_on_to_the_golden(tmp_path, monkeypatch, capsys):
    """The other way: with the context alive, a backward that raises still has its forward compared."""
    script = load_script(write_repro(ONE_CASE, tmp_path, target=implementation("raises_in_backward")), monkeypatch)
    assert script.main() == 1
    output = capsys.readouterr().out
    assert "ERROR: backward raised RuntimeError: planted failure in backward" in output
    assert "The GPU context is lost" not in output
    assert set(script.metrics) >= {"o"} and script.metrics["o"]["verdict"] == "PASS"
