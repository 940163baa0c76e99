"""`sweep --autotune first` (harness/autotune_mode.py): each autotuner compiles and times the first
config its kernel's pruning leaves, not every config; the rows say so; asked for with nothing
external to autotune, it is a usage error."""
import pandas as pd
import pytest
import torch
from triton.runtime.autotuner import Autotuner

from harness import autotune_mode, interpreted_upstream
from harness.cli import main
from tests.autotuned_kernels import doubled_with_width, summed_with_width
from tests.test_upstream import stub_fla  # noqa: F401  (the stand-in fla 0.6.0 fixture)


@pytest.fixture()
def restored(monkeypatch):
    """The autotuner class as it was, after the test; its timings untimed in the interpreter."""
    monkeypatch.setattr(Autotuner, "prune_configs", Autotuner.prune_configs)
    monkeypatch.setattr(Autotuner, "do_bench", Autotuner.__dict__["do_bench"])
    interpreted_upstream.prepare()
    monkeypatch.setattr(doubled_with_width, "cache", {})
    monkeypatch.setattr(summed_with_width, "cache", {})


@pytest.fixture()
def timed(monkeypatch):
    """The WIDTH of every config the autotuners time."""
    widths, bench = [], Autotuner._bench

    def recorded(self, *args, config, **kwargs):
        widths.append(config.kwargs["WIDTH"])
        return bench(self, *args, config=config, **kwargs)

    monkeypatch.setattr(Autotuner, "_bench", recorded)
    return widths


def _run_width(n: int) -> int:
    """The WIDTH a call with key n ran with."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, y = torch.arange(8.0, device=device), torch.zeros(8, device=device)
    width = torch.zeros(1, dtype=torch.int32, device=device)
    doubled_with_width[(1,)](x, y, width, n)
    w = width.item()
    assert torch.equal(y[:w], 2 * x[:w])
    return w


def test_upstream_autotuning_times_every_eligible_config(restored, timed):
    _run_width(8)
    assert sorted(timed) == [4, 8]


def test_first_runs_the_first_config_the_kernels_pruning_leaves_and_times_no_other(restored, timed):
    autotune_mode.first_config_only()
    autotune_mode.first_config_only()   # a second request does not wrap the first
    assert _run_width(7) == 4
    assert set(timed) <= {4}   # a Triton that skips timing a lone config times none
    assert Autotuner.prune_configs.keeps_first


def test_first_passes_over_a_config_that_does_not_fit_the_device_as_upstream_autotuning_does(
        restored, monkeypatch):
    """Triton times a config that does not fit (out of shared memory, a failed compile-time
    assertion) as infinitely slow, and full autotuning never picks it; first-config mode takes
    the next one instead of raising (the last one left is kept untried)."""
    timed, bench = [], Autotuner._bench

    def device_limited(self, *args, config, **kwargs):
        timed.append(config.kwargs["WIDTH"])
        if config.kwargs["WIDTH"] == 4:
            return [float("inf")] * 3
        return bench(self, *args, config=config, **kwargs)

    monkeypatch.setattr(Autotuner, "_bench", device_limited)
    autotune_mode.first_config_only()
    assert _run_width(8) == 8
    assert timed[0] == 4


def test_first_leaves_an_accumulating_kernels_outputs_as_its_autotuner_would(restored, monkeypatch):
    """The timing that finds a fitting config runs the kernel; its reset_to_zero outputs are
    zeroed after it, as Triton's own timing does, so the call's result is one run's."""
    def run_once(call, quantiles=None):
        call()
        return [0.0] * 3

    monkeypatch.setattr(Autotuner, "do_bench", property(lambda self: run_once))
    autotune_mode.first_config_only()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, y = torch.arange(4.0, device=device), torch.zeros(4, device=device)
    summed_with_width[(1,)](x, y, 4)
    assert torch.equal(y, x)


def test_a_repro_script_runs_under_first_config_mode_with_its_arguments(restored, tmp_path):
    from benchmarks.first_config_run import main as first_config_run
    seen = tmp_path / "seen.txt"
    script = tmp_path / "repro.py"
    script.write_text("import sys\nfrom triton.runtime.autotuner import Autotuner\n"
                      f"open({str(seen)!r}, 'w').write(repr((getattr(Autotuner.prune_configs, "
                      "'keeps_first', False), sys.argv[1:])))\n")
    first_config_run([str(script), "--x", "1"])
    assert seen.read_text() == "(True, ['--x', '1'])"


def _sweep(tmp_path, *extra):
    out = tmp_path / "out"
    code = main(["sweep", "--op", "gla", "--variant", "chunk", "--preset", "smoke", "--dtype", "fp32",
                 "--checks", "none", "--no-golden-cache", "--quiet", "--out", str(out), *extra])
    return code, (pd.read_csv(out / "results.csv") if code != 2 else None)


@pytest.mark.parametrize("impl,label", [
    ("fla", "fla.ops.gla:chunk_gla [fla 0.6.0; first config of each autotuner]"),
    ("chunk=fla_kernels.ops.gla:chunk_gla", "fla_kernels.ops.gla:chunk_gla [first config of each autotuner]")])
def test_the_rows_of_a_first_config_sweep_say_so(stub_fla, restored, tmp_path, impl, label):  # noqa: F811
    code, rows = _sweep(tmp_path, "--impl", impl, "--autotune", "first")
    assert code == 0
    assert set(rows["impl"]) == {label}


def test_first_without_an_external_implementation_is_a_usage_error(restored, tmp_path, capsys):
    code, _ = _sweep(tmp_path, "--autotune", "first")
    assert code == 2
    assert "--autotune first is for an external implementation's autotuners (--impl); ours have none" in \
        capsys.readouterr().err
    assert not getattr(Autotuner.prune_configs, "keeps_first", False)
