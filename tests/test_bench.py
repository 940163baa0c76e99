"""`python -m harness bench` on the interpreter: every phase of every source becomes a row (the
times themselves mean nothing here), throughput follows the declared FLOP and byte counts, and bad
arguments are usage errors."""
import pandas as pd
import pytest
import torch

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
    from harness.declaration import load_function
    spec = OPS["rwkv6"]
    case = Case("rwkv6", "fp32", 1, 8, 1, 8, 8, "none", "normal", 0)
    c = Candidate("fla", "chunk", "tests.implementations:raises_in_backward",
                  fn=load_function("tests.implementations:raises_in_backward"))
    rows = {r["phase"]: r for r in measure(c, spec, case, make_inputs(spec, case, "cpu"))}
    assert rows["fwd"]["median_ms"] > 0 and rows["first fwd"]["median_ms"] > 0
    assert rows["fwd+bwd"]["median_ms"] is None
    assert rows["fwd+bwd"]["message"] == "ERROR: RuntimeError: planted failure in backward"


def test_per_kernel_split_per_pass_longest_first():
    from harness.kernel_profile import per_pass
    events = [("_intra", 300.0), ("_o", 100.0), ("_intra", 300.0), ("_o", 100.0), ("_h", 200.0)]
    rows = per_pass(events, passes=2)
    assert [r["kernel"] for r in rows] == ["_intra", "_o", "_h"]
    assert [r["calls"] for r in rows] == [1.0, 1.0, 0.5]
    assert [r["ms"] for r in rows] == pytest.approx([0.3, 0.1, 0.1])
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert rows[0]["share"] == pytest.approx(0.6)
    assert per_pass([], passes=5) == []


def test_kernel_rows_profile_the_forward_and_backward_pass(monkeypatch):
    import harness.kernel_profile as kp
    from harness.bench import Candidate, kernel_rows
    from harness.inputs import make_inputs
    from harness.declaration import load_function
    spec = OPS["rwkv6"]
    case = Case("rwkv6", "fp32", 1, 8, 1, 8, 8, "none", "normal", 0)
    inputs = make_inputs(spec, case, "cpu")
    seen = []

    def fake_events(step, passes=kp.PASSES):
        step()
        seen.append([x.grad is not None for x in inputs.tensors.values()])
        return [("_k", 50.0)] * passes
    monkeypatch.setattr(kp, "device_events", fake_events)
    target = "references.rwkv6:rwkv6_recurrent"
    c = Candidate("torch", "recurrent", target, fn=load_function(target))
    assert kernel_rows(c, inputs) == [{"kernel": "_k", "calls": 1.0, "ms": 0.05, "share": 1.0}]
    assert seen == [[False] * len(inputs.tensors)]  # leaves of its own: the inputs keep no grad
    assert kernel_rows(Candidate("fla", "chunk", "fla:chunk_rwkv6", skip="not installed"), inputs) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU --kernels does time the kernels")
def test_kernels_flag_without_a_gpu_says_so_and_writes_an_empty_split(tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(["bench", "--op", "rwkv6", "--variant", "fused_recurrent", "--impls", "ours",
                 "--B", "1", "--T", "8", "--H", "1", "--K", "8", "--V", "8", "--warm-cache",
                 "--kernels", "--out", str(out)])
    assert code == 0
    assert "no per-kernel times" in capsys.readouterr().out
    split = pd.read_csv(out / "kernels.csv")
    assert split.empty and "kernel" in split.columns
    assert "run with --kernels on a GPU" in (out / "bench.html").read_text()


def test_kernel_split_on_the_page_and_in_markdown():
    from reports.bench import render_bench_html
    from reports.kernels import TOP, kernels_figure, render_kernels_markdown
    shape = dict(op="gla", dtype="bf16", B=8, T=2048, H=16, K=128, V=128, M=0, run_id="r")
    names = [f"_kernel_{i}" for i in range(TOP + 3)]
    ms = [float(len(names) - i) for i in range(len(names))]
    rows = [{**shape, "impl": impl, "variant": "chunk", "kernel": n, "calls": 1.0, "ms": m,
             "share": m / sum(ms)} for impl in ("ours", "fla") for n, m in zip(names, ms)]
    kernels = pd.DataFrame(rows)
    bench = pd.DataFrame([{**shape, "impl": "ours", "variant": "chunk", "phase": "fwd",
                           "median_ms": 1.0, "q25_ms": 0.9, "q75_ms": 1.1, "tflops": 1.0,
                           "gbps": 1.0, "message": "", "device": "d", "torch": "t", "triton": "x",
                           "git": "g"}])
    assert kernels_figure(kernels)[:8] == b"\x89PNG\r\n\x1a\n"
    page = render_bench_html(bench, {"run_id": "r"}, kernels)
    assert 'href="#kernels"' in page and "_kernel_0" in page and "data:image/png" in page
    md = render_kernels_markdown(kernels, top=3)
    assert md.count("| _kernel_0 |") == 2 and "_kernel_3" not in md
    assert md.index("_kernel_0") < md.index("_kernel_1") < md.index("_kernel_2")
    assert "gla chunk · ours" in md and "gla chunk · fla" in md


@pytest.mark.parametrize("planted", [False, True])
def test_each_timed_backward_starts_from_no_gradients(monkeypatch, planted):
    """A timed forward+backward pass assigns its inputs' gradients instead of adding them into the
    previous pass's: the candidate sees every input without a gradient at each call. Planted: a
    pass that keeps them (the bench before) is seen."""
    from harness import bench
    from harness.inputs import make_inputs
    from tests.implementations import baseline_like
    if planted:
        monkeypatch.setattr(bench, "_backward_pass", lambda call, leaves, do: call(*leaves)[0].backward(do))
    seen = []

    def candidate(*args, **kw):
        seen.append([x.grad is not None for x in args if isinstance(x, torch.Tensor) and x.requires_grad])
        return baseline_like(*args, **kw)

    spec = OPS["rwkv6"]
    case = Case("rwkv6", "fp32", 1, 8, 1, 8, 8, "none", "normal", 0)
    rows = bench.measure(bench.Candidate("ours", "chunk", "candidate", fn=candidate), spec, case,
                         make_inputs(spec, case, "cpu"))
    assert rows[-1]["phase"] == "fwd+bwd" and rows[-1]["median_ms"] > 0
    timed = [s for s in seen if s]   # the forward's timed calls take inputs without autograd
    assert len(timed) > 2
    assert any(any(s) for s in timed) == planted, seen
