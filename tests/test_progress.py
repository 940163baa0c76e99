"""A step that runs long (a first call compiling or autotuning for minutes) shows in the progress
bar: which case and implementation, and how long so far."""
from harness import progress
from harness.cli import main

ARGS = ["sweep", "--op", "rwkv6", "--dtype", "fp32", "--variant", "chunk", "--T", "20", "--B", "1",
        "--H", "1", "--K", "16", "--V", "16", "--h0", "none", "--gate", "normal", "--checks", "none",
        "--no-golden-cache", "--impl", "chunk=tests.implementations:slow"]


def test_a_slow_run_shows_its_implementation_and_time_so_far(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "SLOW_STEP_S", 0.3)
    monkeypatch.setattr(progress, "TICK_S", 0.05)
    assert main([*ARGS, "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert ("rwkv6-fp32-B1-T20-H1-K16-V16-h0_none-normal-s0: chunk (tests.implementations:slow): "
            "its run, ") in err
    assert " s so far" in err


def test_quiet_shows_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "SLOW_STEP_S", 0.0)
    monkeypatch.setattr(progress, "TICK_S", 0.05)
    assert main([*ARGS, "--quiet", "--out", str(tmp_path)]) == 0
    assert "so far" not in capsys.readouterr().err
