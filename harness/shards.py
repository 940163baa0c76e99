"""A sweep split over hosts: `--shard I/N` runs a deterministic 1/N of the cases, balanced by cost,
so that a Slurm job array or a CI matrix runs the N shards (`--shard I-J/N`: shards I to J in one
run, one start and one tail for all); each run folder records which cases it owes (plan.json),
and merging shards checks that every case of the sweep is there exactly once."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from harness.parallel import case_cost

PLAN_FILE = "plan.json"


class MergeError(ValueError):
    """Results that do not make one whole sweep: one sentence."""


def parse_shard(text: str) -> tuple[tuple[int, ...], int]:
    """'2/3' -> ((2,), 3); '2-4/5' -> ((2, 3, 4), 5); ValueError for anything but I/N or I-J/N
    with 1 <= I <= J <= N."""
    part, sep, whole = text.partition("/")
    first, dash, last = part.partition("-")
    try:
        i, j, n = int(first), int(last if dash else first), int(whole)
    except ValueError:
        i = j = n = 0
    if not sep or not 1 <= i <= j <= n:
        raise ValueError(f"--shard '{text}' is not I/N or I-J/N with 1 <= I <= J <= N (e.g. 2/3, 2-3/5)")
    return tuple(range(i, j + 1)), n


def shard_label(shard: tuple[tuple[int, ...], int]) -> str:
    """((2,), 3) -> '2/3'; ((2, 3, 4), 5) -> '2-4/5'."""
    ids, n = shard
    return f"{ids[0]}/{n}" if len(ids) == 1 else f"{ids[0]}-{ids[-1]}/{n}"


def shard_indices(plan, shard: tuple[tuple[int, ...], int] | None) -> list[int]:
    """The plan indices the shards (I..., N) run, in plan order: the cases dealt costliest first,
    each to the shard with the least work so far (the lowest-numbered among equals). Every index
    in exactly one shard; the same plan gives the same split on every machine."""
    if shard is None:
        return list(range(len(plan)))
    ids, n = shard
    load = [0] * n
    owner = {}
    for index in sorted(range(len(plan)), key=lambda k: (-case_cost(plan[k][1]), k)):
        target = min(range(n), key=lambda s: (load[s], s))
        owner[index] = target
        load[target] += case_cost(plan[index][1])
    return [k for k in range(len(plan)) if owner[k] + 1 in ids]


def sweep_fingerprint(plan) -> str:
    """The whole sweep's cases, hashed: shards of one sweep share it."""
    ids = "\n".join(case.case_id for _, case, _ in plan)
    return hashlib.sha256(ids.encode()).hexdigest()[:16]


def write_plan(out: Path, plan, indices, shard: tuple[tuple[int, ...], int] | None):
    """Record in the run folder the cases this run owes, and which sweep and shards they are of
    ("shard": [I, N], or [[I, ..., J], N] for several)."""
    if shard is not None:
        ids, n = shard
        shard = [ids[0] if len(ids) == 1 else list(ids), n]
    record = {"sweep": sweep_fingerprint(plan), "sweep_cases": len(plan), "shard": shard,
              "cases": [plan[i][1].case_id for i in indices]}
    (Path(out) / PLAN_FILE).write_text(json.dumps(record, indent=0) + "\n")


def plan_shards(plan: dict) -> tuple[tuple[int, ...], int] | None:
    """The shards a run's plan.json says it holds, as parse_shard gives them (None: unsharded)."""
    if not plan.get("shard"):
        return None
    ids, n = plan["shard"]
    return tuple(ids) if isinstance(ids, list) else (ids,), n


def read_plan(csv_path: Path) -> dict | None:
    path = Path(csv_path).parent / PLAN_FILE
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _cases(csv_path) -> set:
    import pandas as pd
    return set(pd.read_csv(csv_path, usecols=["case_id"], dtype=str, keep_default_na=False)["case_id"])


def check_whole(csv_paths, partial_ok: bool = False) -> str:
    """Raise MergeError unless the results files make whole sweeps: no file twice, no case in two
    shards of one sweep, every case each run owes (its plan.json), and every shard of each
    sharded sweep. Files of different sweeps may share cases (a gate suite's grids overlap).
    With `partial_ok`, what is missing is returned as a sentence ("" when nothing) instead."""
    plans, by_file = {}, {}
    for path in map(str, csv_paths):
        if path in by_file:
            raise MergeError(f"{path} is given twice: merge each shard once")
        by_file[path], plans[path] = _cases(path), read_plan(path)
    seen = {}
    for path, cases in by_file.items():
        sweep = (plans[path] or {}).get("sweep", path)
        for case in sorted(cases):
            if (sweep, case) in seen:
                raise MergeError(f"case {case} is in both {seen[sweep, case]} and {path}, shards of "
                                 "one sweep: merge each shard once")
            seen[sweep, case] = path
    gaps = _gaps(plans, by_file)
    if gaps and not partial_ok:
        raise MergeError(gaps[0])
    return "; ".join(gaps)


def _gaps(plans: dict, by_file: dict) -> list[str]:
    """A sentence per run that lacks some of its cases and per sharded sweep that lacks shards."""
    gaps, sweeps = [], {}
    for path, plan in plans.items():
        if plan is None:
            continue
        shard = plan_shards(plan)
        missing = [c for c in plan["cases"] if c not in by_file[path]]
        if missing:
            where = f"shard {shard_label(shard)} " if shard else ""
            gaps.append(f"{where}{path} lacks {len(missing)} of its {len(plan['cases'])} cases "
                        f"(e.g. {missing[0]}): finish it with --resume")
        if shard:
            sweeps.setdefault((plan["sweep"], shard[1]), set()).update(shard[0])
    for (_, n), shards in sweeps.items():
        absent = sorted(set(range(1, n + 1)) - shards)
        if absent:
            gaps.append(f"shard(s) {', '.join(f'{i}/{n}' for i in absent)} of the sweep are not "
                        "among the results given")
    return gaps
