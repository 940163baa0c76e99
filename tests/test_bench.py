"""`python -m harness bench` on the interpreter: every phase of every source becomes a row (the
times themselves mean nothing here), throughput follows the declared FLOP and byte counts, and bad
arguments are usage errors."""
import pandas as pd
import pytest

from harness.bench import nominal_flops
from harness.cases import Case
from harness.cli import main
from harness.registry import OPS


def test_every_phase_of_every_source_is_a_row(tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(["bench", "--op", "rwkv6", "--variant", "fused_recurrent", "--B", "1", "--T", "20",
                 "--H", "1", "--K", "16", "--V", "16", "--warm-cache", "--out", str(out)])
    assert code == 0
    rows = pd.read_csv(out / "bench.csv", keep_default_na=False)
    ours = rows[rows["impl"] == "ours"]
    assert sorted(ours["phase"]) == ["first bwd", "first fwd", "fwd", "fwd+bwd"]
    assert set(rows["impl"]) == {"ours", "fla", "torch"}
    fwd = ours[ours["phase"] == "fwd"].iloc[0]
    flops = nominal_flops(OPS["rwkv6"], Case("rwkv6", "bf16", 1, 20, 1, 16, 16, "none", "normal", 0))
    assert float(fwd["tflops"]) == pytest.approx(flops / (float(fwd["median_ms"]) * 1e-3) / 1e12,
                                                 rel=1e-6)
    fla = rows[rows["impl"] == "fla"]
    assert all(m.startswith(("SKIP: ", "ERROR: ")) or m == "" for m in fla["message"])
    assert (out / "bench.html").exists()
    assert "| rwkv6 | bf16 |" in capsys.readouterr().out


def test_nominal_flops_of_the_chunked_form():
    case = Case("gla", "bf16", 8, 2048, 16, 128, 128, "none", "normal", 0)
    per_head = 2 * 2048 * (64 * 128 + 64 * 128 + 2 * 128 * 128)
    assert nominal_flops(OPS["gla"], case) == 8 * 16 * per_head
    slots = Case("gsa", "bf16", 1, 64, 1, 32, 16, "none", "normal", 0, M=8)
    assert nominal_flops(OPS["gsa"], slots) == 2 * 64 * (64 * 32 + 64 * 8 + 2 * 32 * 8) + \
        2 * 64 * (64 * 8 + 64 * 16 + 2 * 8 * 16)


@pytest.mark.parametrize("extra,message", [
    (["--op", "nope"], "unknown op"),
    (["--op", "gla", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["--op", "gla", "--impls", "ours,triton"], "unknown implementation source 'triton'"),
    (["--op", "gla", "--T", "0"], "--T must be a positive integer"),
    (["--op", "gla", "--variant", "fast"], "unknown variant of gla 'fast'"),
])
def test_bad_arguments_exit_2_in_one_line(tmp_path, capsys, extra, message):
    assert main(["bench", *extra, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "b").exists()


def test_a_backward_that_refuses_still_has_its_forward_timed():
    from harness.bench import Candidate, measure
    from harness.inputs import make_inputs
    from harness.registry import load_function
    spec = OPS["rwkv6"]
    case = Case("rwkv6", "fp32", 1, 8, 1, 8, 8, "none", "normal", 0)
    c = Candidate("fla", "chunk", "tests.implementations:raises_in_backward",
                  fn=load_function("tests.implementations:raises_in_backward"))
    rows = {r["phase"]: r for r in measure(c, spec, case, make_inputs(spec, case, "cpu"))}
    assert rows["fwd"]["median_ms"] > 0 and rows["first fwd"]["median_ms"] > 0
    assert rows["fwd+bwd"]["median_ms"] is None
    assert rows["fwd+bwd"]["message"] == "ERROR: RuntimeError: planted failure in backward"
