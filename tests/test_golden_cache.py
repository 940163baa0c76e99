"""Stored goldens: found again under the same key, missed when anything that determines them changes."""
import os

import torch

from harness import golden_cache
from harness.cases import Case
from harness.checks.segments import segment_bounds
from harness.golden_cache import GoldenCache
from harness.declaration import load_function
from harness.registry import get_op
from harness.runner import Implementation, run_case

SPEC = get_op("rwkv6")
CPU = torch.device("cpu")
GOOD = Implementation("chunk", "baseline_like", load_function("tests.implementations:baseline_like"))


def case(seed=1, T=40):
    return Case(op="rwkv6", dtype="bf16", B=1, T=T, H=2, K=8, V=6, h0="grad", gate="normal", seed=seed)


def test_second_run_reads_every_golden_and_gives_the_same_rows(tmp_path):
    cache = GoldenCache(tmp_path)
    first = run_case(SPEC, case(), [GOOD], CPU, cache=cache)
    computed = cache.misses
    assert computed == 5 and cache.hits == 0  # the case, the segments' baseline, three options
    second = run_case(SPEC, case(), [GOOD], CPU, cache=cache)
    assert cache.hits == computed and cache.misses == computed
    strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in first]
    assert strip == [{k: v for k, v in r.items() if k != "wall_s"} for r in second]


def test_key_changes_with_the_case_the_options_and_the_code(tmp_path, monkeypatch):
    cache = GoldenCache(tmp_path)
    key = cache.key(SPEC, case(), {})
    assert key == GoldenCache(tmp_path).key(SPEC, case(), {})
    assert key != cache.key(SPEC, case(seed=2), {})
    assert key != cache.key(SPEC, case(T=41), {})
    assert key != cache.key(SPEC, case(), {"final_state": "off"})
    source = tmp_path / "reference.py"
    source.write_text("x = 1\n")
    monkeypatch.setattr(golden_cache, "ROOT", tmp_path)
    monkeypatch.setattr(golden_cache, "FINGERPRINTED", ["reference.py"])
    before = GoldenCache(tmp_path).key(SPEC, case(), {})
    source.write_text("x = 2\n")
    assert GoldenCache(tmp_path).key(SPEC, case(), {}) != before


def test_a_stored_golden_is_what_the_rows_are_measured_against(tmp_path):
    """A tampered stored golden changes the verdict: the cache is really read."""
    cache = GoldenCache(tmp_path)
    run_case(SPEC, case(), [GOOD], CPU, cache=cache)
    path = cache._path(cache.key(SPEC, case(), {}))
    stored = torch.load(path)
    for kind in ("golden", "baseline"):
        stored[kind]["o"] = stored[kind]["o"] + 1
    torch.save(stored, path)
    rows = run_case(SPEC, case(), [GOOD], CPU, cache=cache)
    o = [r for r in rows if r["check"] == "golden" and r["tensor"] == "o"][0]
    assert o["verdict"] == "FAIL"


def test_the_store_keeps_to_its_limit_dropping_the_least_recently_used(tmp_path):
    cache = GoldenCache(tmp_path)
    cases = [case(seed=s) for s in (1, 2, 3)]
    sizes = []
    for c in cases:
        cache.put(SPEC, c, {}, {"o": torch.zeros(1000, dtype=torch.float64)}, {"o": torch.zeros(10)})
        path = cache._path(cache.key(SPEC, c, {}))
        os.utime(path, (1000 * c.seed, 1000 * c.seed))  # stored long ago, oldest first
        sizes.append(path.stat().st_size)
    small = GoldenCache(tmp_path, limit_bytes=sum(sizes[:2]))
    assert small.get(SPEC, cases[0], {}, CPU) is not None  # used now: kept
    small.put(SPEC, case(seed=4), {}, {"o": torch.zeros(1000, dtype=torch.float64)}, {"o": torch.zeros(10)})
    kept = [small._path(small.key(SPEC, c, {})).exists() for c in cases + [case(seed=4)]]
    assert kept == [True, False, False, True]


def test_entries_other_processes_evict_or_leave_half_written_are_misses_not_errors(tmp_path,
                                                                                   monkeypatch):
    """The store is shared by concurrent sweeps (a sweep's workers, the gate's op sweeps): an
    entry removed by another process's eviction between listing and use, or one cut short, costs
    a recomputation, never an ERROR row; and reading never re-creates an evicted entry."""
    cache = GoldenCache(tmp_path)
    stored, gone, torn = case(seed=1), case(seed=2), case(seed=3)
    for c in (stored, gone, torn):
        cache.put(SPEC, c, {}, {"o": torch.zeros(10, dtype=torch.float64)}, {"o": torch.zeros(10)})
    real_load = torch.load

    def evicted_meanwhile(path, **kwargs):
        if path == cache._path(cache.key(SPEC, gone, {})):
            path.unlink()
        return real_load(path, **kwargs)
    monkeypatch.setattr(torch, "load", evicted_meanwhile)
    assert cache.get(SPEC, gone, {}, CPU) is None
    assert not cache._path(cache.key(SPEC, gone, {})).exists()
    torn_path = cache._path(cache.key(SPEC, torn, {}))
    torn_path.write_bytes(torn_path.read_bytes()[:40])
    assert cache.get(SPEC, torn, {}, CPU) is None and not torn_path.exists()
    assert cache.get(SPEC, stored, {}, CPU) is not None
    vanished = tmp_path / "ff" / "vanished.pt"
    listing = list(tmp_path.rglob("*.pt")) + [vanished]
    empty = GoldenCache(tmp_path, limit_bytes=0)
    monkeypatch.setattr(type(tmp_path), "rglob", lambda self, pattern: iter(listing))
    empty._evict()
    assert not any(p.exists() for p in listing)


def test_an_entry_slower_to_write_than_to_compute_is_not_stored(tmp_path):
    """Reading an entry back costs about what writing it did: one that took less time to compute
    than it takes to write is computed again instead (a GPU's long float64 goldens)."""
    cache = GoldenCache(tmp_path)
    cache.bytes_per_s = 10**6
    golden, baseline = {"o": torch.zeros(1000, dtype=torch.float64)}, {"o": torch.zeros(10)}   # 8,040 B: 8 ms
    assert not cache.put(SPEC, case(seed=1), {}, golden, baseline, seconds=0.004)
    assert cache.skipped == 1 and not cache._path(cache.key(SPEC, case(seed=1), {})).exists()
    assert cache.put(SPEC, case(seed=2), {}, golden, baseline, seconds=0.016)
    assert cache.put(SPEC, case(seed=3), {}, golden, baseline)   # time unknown: stored
    assert cache.get(SPEC, case(seed=2), {}, CPU) is not None


def test_the_store_times_its_own_writes_of_large_entries(tmp_path):
    cache = GoldenCache(tmp_path)
    small = {"o": torch.zeros(1000, dtype=torch.float64)}
    cache.put(SPEC, case(seed=1), {}, small, small)
    assert cache.bytes_per_s == golden_cache.PRIOR_BYTES_PER_S   # a small file times its overhead
    large = {"o": torch.ones(golden_cache.MEASURED_FROM_BYTES // 8, dtype=torch.float64)}
    cache.put(SPEC, case(seed=2), {}, large, small)
    assert cache.bytes_per_s != golden_cache.PRIOR_BYTES_PER_S


def test_a_chain_of_segments_stores_its_baseline_alone_and_is_found_with_its_golden_given(tmp_path):
    cache = GoldenCache(tmp_path)
    run_case(SPEC, case(), [GOOD], CPU, cache=cache)
    options = {"segments": segment_bounds(case().T)}
    stored = torch.load(cache._path(cache.key(SPEC, case(), options)))
    assert stored["golden"] is None and stored["baseline"]["o"] is not None
    assert cache.get(SPEC, case(), options, CPU) is None
    assert cache.get(SPEC, case(), options, CPU, golden_given=True)[1]["o"].equal(stored["baseline"]["o"])
