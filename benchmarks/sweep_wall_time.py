"""Wall time of a default sweep, per dtype (a benchmark, not a test).

    python benchmarks/sweep_wall_time.py --op rwkv6 --dtype fp32,fp16,bf16 [--preset cpu]

Runs `python -m harness sweep` once per dtype in a fresh process (compile and interpreter start-up
included, as a user sees it, goldens computed rather than read from a store) and prints one line
per dtype: cases, rows, verdicts, seconds.
"""
import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--op", default="rwkv6")
    parser.add_argument("--dtype", default="fp32,fp16,bf16")
    parser.add_argument("--preset", default=None)
    args = parser.parse_args()
    for dtype in args.dtype.split(","):
        out = Path(tempfile.mkdtemp(prefix=f"sweep-{dtype}-"))
        cmd = [sys.executable, "-m", "harness", "sweep", "--op", args.op, "--dtype", dtype,
               "--out", str(out), "--quiet", "--no-golden-cache"]
        cmd += ["--preset", args.preset] if args.preset else []
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        df = pd.read_csv(out / "results.csv")
        counts = df["verdict"].value_counts().to_dict()
        print(f"{args.op} {dtype}: {df['case_id'].nunique()} cases, {len(df)} rows, {counts}, "
              f"exit {proc.returncode}, {wall:.1f} s")


if __name__ == "__main__":
    main()
