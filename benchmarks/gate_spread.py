"""How far a correct kernel's numbers move between machines: the data behind the gate's noise model.

    python benchmarks/gate_spread.py run OUT [--configs default,haswell,...] [--ops gla,...] [--jobs 2]
    python benchmarks/gate_spread.py compare OUT/default OTHER [...]     # any folders of results CSVs

`run` sweeps the gate's suite of this device class (baselines/gate.json) once per configuration, each
a set of environment variables that changes how the same kernels' arithmetic is carried out: which
BLAS kernels OpenBLAS uses for the Triton interpreter's products (OPENBLAS_CORETYPE), thread counts
(summation orders of BLAS and of torch's reductions), the vector width of torch's CPU kernels
(ATEN_CPU_CAPABILITY) and MKL's code path (MKL_ENABLE_INSTRUCTIONS, MKL_CBWR). Goldens are computed
afresh in each. `compare` lines up the rows of two runs and prints, per check and dtype, the largest
growth of err/bound and how many roundings of the golden (`floor`) the largest err moved by beyond
the growth factor and atol: the noise the gate must allow so that unchanged kernels pass on any
machine.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from harness.gate import BASELINE_DIR, GateConfig, suite_arguments
from harness.registry import OPS
from reports import read_results

CONFIGS = {
    "default": {},
    "haswell": {"OPENBLAS_CORETYPE": "Haswell"},
    "sandybridge": {"OPENBLAS_CORETYPE": "SandyBridge"},
    "prescott": {"OPENBLAS_CORETYPE": "Prescott"},
    "one_thread": {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "MKL_CBWR": "AVX2"},
}
KEY = ["op", "case_id", "variant", "check", "tensor"]


def run(out: Path, configs, ops, jobs: int):
    suite = GateConfig.load(BASELINE_DIR).suite("cpu")
    tasks = [(name, op) for name in configs for op in ops]

    def one(task):
        name, op = task
        folder = out / name / op
        command = [sys.executable, "-m", "harness", "sweep", "--op", op, *suite_arguments(suite),
                   "--out", str(folder), "--quiet", "--no-golden-cache", "--force"]
        env = {**os.environ, **CONFIGS[name]}
        folder.mkdir(parents=True, exist_ok=True)
        with open(out / name / f"{op}.log", "w") as log:
            code = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        print(f"{name} {op}: exit {code}", flush=True)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, tasks))


def _rows(folder: Path) -> pd.DataFrame:
    paths = sorted(Path(folder).rglob("*.csv"))
    return read_results(paths).drop_duplicates(KEY)


def spread(a: pd.DataFrame, b: pd.DataFrame, factor: float = 2.0, ratio_floor: float = 0.05):
    """Per (check, dtype): rows compared, the largest err/bound growth either way, and the largest
    number of roundings of the golden by which err exceeded `factor` times the other run's err
    (either way) among rows at or above `ratio_floor`, with the row that needed it."""
    j = a.merge(b, on=KEY, suffixes=("_a", "_b"))
    j = j[(j["verdict_a"] == "PASS") & (j["verdict_b"] == "PASS") & j["ratio_a"].notna()]
    # the floor is the golden's rounding, the same on every machine: a baseline written before
    # it was recorded takes the other run's
    j = j.assign(**{f"{c}_{x}": j[f"{c}_{x}"].fillna(j[f"{c}_{y}"]).fillna(0.0 if c == "atol" else np.nan)
                    for c in ("floor", "atol") for x, y in (("a", "b"), ("b", "a"))})
    out = []
    for (check, dtype), g in j.groupby(["check", "dtype_a"]):
        need = []
        for x, y in (("a", "b"), ("b", "a")):
            over = ((g[f"ratio_{x}"] - factor * g[f"ratio_{y}"]) * g[f"bound_{x}"]
                    - g[f"atol_{x}"]) / g[f"floor_{x}"]
            need.append(over.where(g[f"ratio_{x}"] >= ratio_floor))
        need = pd.concat(need, axis=1).max(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            growth = np.maximum(g["ratio_a"] / g["ratio_b"], g["ratio_b"] / g["ratio_a"])
        flagged = ((np.maximum(g["ratio_a"], g["ratio_b"]) >= ratio_floor)
                   & (growth > factor)).sum()
        worst = need.idxmax() if need.notna().any() else None
        out.append({"check": check, "dtype": dtype, "rows": len(g),
                    "differ": int((g["err_a"] != g["err_b"]).sum()),
                    "max growth": float(growth.replace(np.inf, np.nan).max()),
                    "old rule flags": int(flagged),
                    "roundings needed": float(need.max()) if worst is not None else float("nan"),
                    "row": "" if worst is None else
                    f"{g.at[worst, 'case_id']} {g.at[worst, 'variant']} {g.at[worst, 'tensor']}"})
    return pd.DataFrame(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--configs", default=",".join(CONFIGS))
    r.add_argument("--ops", default=",".join(OPS))
    r.add_argument("--jobs", type=int, default=2)
    c = sub.add_parser("compare")
    c.add_argument("reference", type=Path)
    c.add_argument("others", type=Path, nargs="+")
    args = parser.parse_args()
    if args.command == "run":
        run(args.out, args.configs.split(","), args.ops.split(","), args.jobs)
        return
    reference = _rows(args.reference)
    pd.set_option("display.width", 200)
    for other in args.others:
        print(f"\n{args.reference} against {other}")
        print(spread(reference, _rows(other)).to_string(index=False, float_format=lambda x: f"{x:.3g}"))


if __name__ == "__main__":
    main()
