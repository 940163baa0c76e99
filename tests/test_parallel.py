"""A sweep spread over worker processes (`--jobs`) or split into shards (`--shard I/N`, merged by
`report` and `gate --results`) ends with exactly the rows of one unsplit sweep; a worker whose
process dies costs only its case; merging refuses results that miss a case or hold one twice.
The sweeps run as `python -m harness sweep` on the toy op (tests/toy_op.py)."""
import os
import subprocess
import sys

import pandas as pd
import pytest

from harness import gate, parallel
from harness.cases import Case
from harness.cli import main
from harness.registry import EXTRA_DECLARATIONS, OPS, declaration_modules, load_declarations
from harness.shards import plan_shards, shard_indices

ARGS = ["sweep", "--op", "toy_decay", "--dtype", "fp32", "--B", "1", "--H", "1", "--K", "16",
        "--V", "16", "--h0", "none,grad", "--gate", "normal", "--T", "5,33", "--no-golden-cache",
        "--quiet"]
KEY = ["case_id", "variant", "impl", "check", "tensor"]
SAME = KEY + ["verdict", "err", "bound", "message", "case_rows"]
DYING = "toy_decay-fp32-B1-T20-H1-K16-V16-h0_none-normal-s0"


def harness(args):
    """`python -m harness args` in a process of its own (the workers of --jobs are real processes)."""
    env = {**os.environ, EXTRA_DECLARATIONS: "tests.toy_op", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "harness", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def rows(out):
    got = pd.read_csv(out / "results.csv", dtype=str, keep_default_na=False)
    assert not got.duplicated(KEY).any()
    return got


def same_rows(got, want):
    """The same rows, in any order (workers finish cases in any order)."""
    order = lambda df: df[SAME].sort_values(KEY).reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(order(got), order(want))


@pytest.fixture(scope="module")
def toy():
    """The toy op declared in this process too (the sweeps run here save a process start each)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(EXTRA_DECLARATIONS, "tests.toy_op")
        mp.setitem(OPS, "toy_decay", load_declarations(declaration_modules())["toy_decay"])
        yield


@pytest.fixture(scope="module")
def unsplit(toy, tmp_path_factory):
    out = tmp_path_factory.mktemp("unsplit")
    assert main([*ARGS, "--out", str(out)]) == 0
    return rows(out)


def test_two_workers_give_the_rows_of_one_process(unsplit, tmp_path):
    done = harness([*ARGS, "--jobs", "2", "--out", str(tmp_path)])
    assert done.returncode == 0, done.stderr
    assert "2 workers" in done.stdout
    same_rows(rows(tmp_path), unsplit)
    assert rows(tmp_path)["run_id"].nunique() == 1


def test_three_shards_merged_are_the_unsplit_sweep_and_a_missing_or_doubled_one_is_refused(
        unsplit, tmp_path, capsys):
    folders = [tmp_path / f"shard{i}" for i in (1, 2, 3)]
    for i, folder in enumerate(folders, 1):
        assert main([*ARGS, "--shard", f"{i}/3", "--out", str(folder)]) == 0
        assert f"shard {i}/3" in capsys.readouterr().out
    parts = [rows(f) for f in folders]
    assert all(len(p) for p in parts)
    same_rows(pd.concat(parts), unsplit)
    csvs = [str(f / "results.csv") for f in folders]
    assert main(["report", *csvs, "--html", str(tmp_path / "all.html")]) == 0
    capsys.readouterr()
    with pytest.warns(UserWarning, match="shard\\(s\\) 3/3 of the sweep are not among the results given"):
        assert main(["report", *csvs[:2]]) == 1   # rendered, but not a whole sweep
    assert "incomplete" in capsys.readouterr().out
    assert main(["report", *csvs, csvs[0]]) == 2
    assert "merge each shard once" in capsys.readouterr().err
    cut = pd.read_csv(csvs[1], dtype=str, keep_default_na=False)
    cut[cut["case_id"] != cut["case_id"].iloc[0]].to_csv(csvs[1], index=False)
    assert main(["gate", "--results", *csvs, "--out", str(tmp_path / "gate")]) == 2
    err = capsys.readouterr().err
    assert "shard 2/3" in err and "finish it with --resume" in err


def test_a_worker_that_dies_costs_its_case_and_a_new_worker_goes_on(tmp_path):
    args = ["sweep", "--op", "toy_decay", "--dtype", "fp32", "--B", "1", "--H", "1", "--K", "16",
            "--V", "16", "--h0", "none", "--gate", "normal", "--T", "5,20,33,40", "--checks", "none",
            "--no-golden-cache", "--quiet", "--impl", "chunk=tests.toy_op:chunk_toy_decay_aborting_at_T20"]
    done = harness([*args, "--jobs", "2", "--out", str(tmp_path)])
    assert done.returncode == 1, done.stderr
    assert "died (killed by SIGABRT) in case " + DYING in done.stdout
    assert f"case {DYING} died beside other workers on its device" in done.stdout   # then alone
    got = rows(tmp_path)
    assert sorted(got["case_id"].unique()) == sorted(
        f"toy_decay-fp32-B1-T{T}-H1-K16-V16-h0_none-normal-s0" for T in (5, 20, 33, 40))
    died = got[got["case_id"] == DYING]
    assert list(died["verdict"]) == ["ERROR"]
    assert died["message"].iloc[0].startswith("the sweep process died during this case (killed by SIGABRT)")
    assert "its run" in died["message"].iloc[0]
    assert (got[got["case_id"] != DYING]["verdict"] == "PASS").all()


OUT_OF_MEMORY = ["sweep", "--op", "toy_decay", "--dtype", "fp32", "--B", "1", "--H", "1", "--K", "16",
                 "--V", "16", "--h0", "none", "--gate", "normal", "--checks", "none", "--variant", "chunk",
                 "--no-golden-cache", "--quiet"]


def out_of_memory_sweep(out, calls: int, jobs: int = 2, T: str = "5,20,33,40",
                        kernel: str = "chunk_toy_decay_out_of_memory_once_at_T20"):
    """The sweep above with its T = 20 case out of memory in its first `calls` calls."""
    args = OUT_OF_MEMORY + ["--T", T, "--impl", f"chunk=tests.toy_op:{kernel}"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOY_OOM_ONCE", str(out) + ".calls")
        mp.setenv("TOY_OOM_CALLS", str(calls))
        mp.setenv("TOY_CALLS", str(out) + ".timed")
        return harness([*args, "--jobs", str(jobs), "--out", str(out)])


def all_pass_with_the_retried_case(done, out):
    assert done.returncode == 0, done.stdout + done.stderr
    got = rows(out)
    assert got["case_id"].nunique() == 4 and (got["verdict"] == "PASS").all()


def test_a_case_out_of_memory_beside_other_workers_runs_again_beside_smaller_ones(tmp_path):
    """Workers share their device's memory: a case that ran out of it beside them (the first call
    of this kernel, at T = 20) runs again once the cases beside it are smaller, and its rows are
    that run's. In one process nothing shares the device: the ERROR row stands."""
    shared = out_of_memory_sweep(tmp_path / "two", calls=1)
    all_pass_with_the_retried_case(shared, tmp_path / "two")
    assert (f"case {DYING} ran out of memory beside other workers on its device; it runs again once "
            "those beside it there are smaller") in shared.stdout
    assert "alone" not in shared.stdout
    alone = out_of_memory_sweep(tmp_path / "one", calls=1, jobs=1)
    assert alone.returncode == 1
    lone = rows(tmp_path / "one")
    assert list(lone[lone["verdict"] != "PASS"]["case_id"]) == [DYING]
    assert "out of memory" in lone[lone["case_id"] == DYING]["message"].iloc[0]


def test_a_case_out_of_memory_waits_for_a_larger_one_beside_it_to_end(tmp_path):
    """Nothing else left to run, a worker whose case (T = 20) ran out of memory beside a larger
    one (T = 40, 2 s a call) waits: the retry starts after the larger case's calls end."""
    done = out_of_memory_sweep(tmp_path / "run", calls=1, T="20,40",
                               kernel="chunk_toy_decay_out_of_memory_once_at_T20_slow_at_T40")
    assert done.returncode == 0, done.stdout + done.stderr
    got = rows(tmp_path / "run")
    assert got["case_id"].nunique() == 2 and (got["verdict"] == "PASS").all()
    calls = [line.split() for line in open(str(tmp_path / "run") + ".timed")]
    large_end = max(float(end) for _, T, _, end in calls if T == "40")
    small = sorted(float(start) for _, T, start, _ in calls if T == "20")
    assert len(small) >= 2 and small[0] < large_end < small[1]


def test_a_case_out_of_memory_twice_beside_other_workers_runs_again_alone(tmp_path):
    shared = out_of_memory_sweep(tmp_path, calls=2)
    all_pass_with_the_retried_case(shared, tmp_path)
    assert (f"case {DYING} ran out of memory again beside other workers on its device; it runs again "
            "alone there after the others") in shared.stdout


def test_a_case_out_of_memory_alone_too_keeps_its_error_row(tmp_path):
    """Run again beside smaller cases, then alone, and out of memory each time, a case's ERROR row
    stands: it runs three times, no more."""
    done = out_of_memory_sweep(tmp_path, calls=99)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count("those beside it there are smaller") == 1
    assert done.stdout.count("runs again alone") == 1
    assert len(open(str(tmp_path) + ".calls").readlines()) == 3
    got = rows(tmp_path)
    assert got["case_id"].nunique() == 4
    failed = got[got["verdict"] != "PASS"]
    assert list(failed["case_id"]) == [DYING] and list(failed["verdict"]) == ["ERROR"]
    assert "out of memory" in failed["message"].iloc[0]


def test_a_case_out_of_memory_runs_again_beside_smaller_cases_only_and_no_other_retry():
    plan = [(None, case(T), None) for T in (40, 33, 20, 5)]
    assert not parallel.may_run_again(2, plan, [0], set())         # T = 40 running beside
    assert not parallel.may_run_again(2, plan, [3, 3, 3, 3], set())  # four of T = 5: as large
    assert parallel.may_run_again(2, plan, [3, 3, 3], set())
    assert parallel.may_run_again(2, plan, [], set())
    assert not parallel.may_run_again(0, plan, [3], {3})             # another retry beside


def case(T, H=1):
    return Case(op="toy", dtype="fp32", B=1, T=T, H=H, K=16, V=16, h0="none", gate="normal", seed=0)


def test_shards_split_every_case_once_by_cost_the_same_way_each_time():
    plan = [(None, case(T, H), None) for T in (1, 7, 64, 1000, 4096, 65) for H in (1, 2, 4)]
    shards = [shard_indices(plan, ((i,), 3)) for i in (1, 2, 3)]
    assert sorted(sum(shards, [])) == list(range(len(plan)))
    assert shards == [shard_indices(plan, ((i,), 3)) for i in (1, 2, 3)]
    assert shard_indices(plan, ((2, 3), 3)) == sorted(shards[1] + shards[2])
    loads = [sum(parallel.case_cost(plan[k][1]) for k in s) for s in shards]
    assert max(loads) - min(loads) <= max(parallel.case_cost(c) for _, c, _ in plan)
    assert parallel.dealing_order(plan, range(len(plan)))[0] == next(
        k for k, (_, c, _) in enumerate(plan) if c.T == 4096 and c.H == 4)


def test_a_shard_of_one_large_case_also_takes_small_ones():
    """Every case has a fixed cost (CASE_OVERHEAD) besides its size: with one case three times that
    and twelve whose size is next to nothing, two shards take 1 + 4 and 8 cases, not 1 and 12."""
    big = Case(op="toy", dtype="fp32", B=1, T=3 * parallel.CASE_OVERHEAD // 256, H=1, K=16, V=16,
               h0="none", gate="normal", seed=0)
    plan = [(None, big, None)] + [(None, case(T), None) for T in range(1, 13)]
    first, second = (shard_indices(plan, ((i,), 2)) for i in (1, 2))
    assert (first[0], len(first), len(second)) == (0, 5, 8)


def test_a_worker_keeps_to_its_op_then_takes_one_no_other_worker_is_on():
    plan = [(None, Case(op=op, dtype="fp32", B=1, T=T, H=1, K=16, V=16, h0="none", gate="normal",
                        seed=0), None) for op, T in (("a", 900), ("b", 800), ("c", 700), ("a", 10))]
    todo = parallel.dealing_order(plan, range(len(plan)))
    assert todo == [0, 1, 2, 3]
    assert parallel.next_case(todo, plan, "a", {"b"}) == 0
    assert parallel.next_case(todo[1:], plan, "a", {"b"}) == 2   # its own op's last case
    assert parallel.next_case(todo[1:3], plan, "a", {"b"}) == 1  # "a" done: "c", which no one is on
    assert parallel.next_case(todo[1:3], plan, None, {"b", "c"}) == 0   # every op taken: the costliest


@pytest.mark.parametrize("text", ["0/3", "4/3", "1", "a/b", "1/0", "3-2/3", "2-4/3", "1-/3", "x-2/3"])
def test_a_bad_shard_is_one_line_and_exit_2(toy, text, capsys):
    assert main([*ARGS, "--shard", text]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not I/N" in err


def test_shards_run_together_merge_with_the_others_into_the_unsplit_sweep(unsplit, tmp_path, capsys):
    """`--shard 2-3/3` runs shards 2 and 3 in one run: merged with shard 1 it is the whole sweep;
    with shard 3 as well, a case is there twice; alone, shard 1 is missing. A run folder written
    before ranges (plan.json's "shard": [I, N]) reads as that one shard."""
    both, first = tmp_path / "2-3", tmp_path / "1"
    assert main([*ARGS, "--shard", "2-3/3", "--out", str(both)]) == 0
    assert "shard 2-3/3" in capsys.readouterr().out
    assert main([*ARGS, "--shard", "1/3", "--out", str(first)]) == 0
    same_rows(pd.concat([rows(both), rows(first)]), unsplit)
    csvs = [str(f / "results.csv") for f in (first, both)]
    capsys.readouterr()
    assert main(["report", *csvs, "--html", str(tmp_path / "all.html")]) == 0
    with pytest.warns(UserWarning, match="shard\\(s\\) 1/3 of the sweep are not among the results given"):
        assert main(["report", csvs[1]]) == 1
    third = tmp_path / "3"
    assert main([*ARGS, "--shard", "3/3", "--out", str(third)]) == 0
    capsys.readouterr()
    assert main(["report", *csvs, str(third / "results.csv")]) == 2
    assert "merge each shard once" in capsys.readouterr().err
    assert plan_shards({"shard": [2, 3]}) == ((2,), 3) and plan_shards({"shard": None}) is None


def test_each_gate_sweep_sees_one_gpu_in_turn(monkeypatch, tmp_path):
    """Four op sweeps on two GPUs, two at a time: the two in flight always see different GPUs.
    Each fake sweep waits for its partner, so the pairs are in flight together whatever the
    threads' timing (a sweep that ends before the next starts could otherwise take its GPU again)."""
    import threading
    monkeypatch.setattr(parallel, "visible_gpus", lambda: ["3", "5"])
    both_in_flight = threading.Barrier(2, timeout=30)
    seen, in_flight, lock = [], set(), threading.Lock()

    def run(command, env, **kwargs):
        dev = env[parallel.DEVICES]
        with lock:
            assert dev not in in_flight, f"two sweeps on GPU {dev} at once"
            in_flight.add(dev)
            seen.append(dev)
        both_in_flight.wait()
        with lock:
            in_flight.discard(dev)
        return subprocess.CompletedProcess(command, 0)
    monkeypatch.setattr(gate.subprocess, "run", run)
    gate.run_sweeps(["a", "b", "c", "d"], [{}], tmp_path, jobs=2, echo=lambda *a, **k: None)
    assert sorted(seen) == ["3", "3", "5", "5"]


def test_gate_sweeps_on_one_gpu_share_it_among_their_workers_and_the_cores(monkeypatch, tmp_path):
    """`gate --jobs 2 --sweep-jobs 3` on one GPU: both sweeps see it and deal their cases to three
    workers each (sweep --jobs 3), and the six processes split the CPU's threads."""
    monkeypatch.setattr(parallel, "visible_gpus", lambda: ["0"])
    calls = []

    def run(command, env, **kwargs):
        calls.append((command[command.index("--jobs") + 1], env[parallel.DEVICES], env["OMP_NUM_THREADS"]))
        return subprocess.CompletedProcess(command, 0)
    monkeypatch.setattr(gate.subprocess, "run", run)
    gate.run_sweeps(["a", "b"], [{}], tmp_path, jobs=2, echo=lambda *a, **k: None, workers=3)
    assert calls == [("3", "0", str(parallel.threads_per_worker(6)))] * 2


def _deaf_to_sigterm(ready):
    import signal
    import time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(60)


def test_a_worker_that_does_not_exit_when_asked_is_killed():
    """An interrupted sweep asks its workers to stop; one that does not is killed."""
    import multiprocessing
    import time
    from harness.parallel import _end
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    deaf = spawn.Process(target=_deaf_to_sigterm, args=(ready,), daemon=True)
    deaf.start()
    assert ready.wait(60)
    start = time.monotonic()
    _end(deaf, grace_s=0.5, ask=True)
    assert not deaf.is_alive() and deaf.exitcode == -9 and time.monotonic() - start < 30


def test_a_worker_that_does_not_exit_when_done_is_killed():
    """A worker past its last case (or whose GPU context died, whose teardown can hang) gets a
    grace period to exit, then is killed, so the sweep never waits on it forever."""
    import multiprocessing
    import time
    from harness.parallel import _end
    stuck = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,), daemon=True)
    stuck.start()
    start = time.monotonic()
    _end(stuck, grace_s=0.5)
    assert not stuck.is_alive() and stuck.exitcode == -9 and time.monotonic() - start < 30
