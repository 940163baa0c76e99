"""Our kernels' speed before and after a change, measured side by side on one machine: `harness
bench` of our implementation in a base tree (another checkout, its own code first on the path)
and in this one, alternately for --rounds rounds (the first with --kernels), then one markdown
summary: each op's and phase's median per tree and round, and per kernel the base's ms and this
tree's. Every other argument goes to `harness bench` as it is.

    python -m benchmarks.ab_bench --base DIR --out DIR --op delta_rule,gated_delta_rule,kda \\
        --variant chunk --T 4096 --dtype bf16
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from benchmarks.checkouts import HERE, env_for

PHASES = ("fwd", "fwd+bwd")


def bench_in(tree: str, out: Path, bench_args: list[str], kernels: bool) -> None:
    """`python -m harness bench` (our implementation, Triton's cache kept) run in tree into out."""
    command = [sys.executable, "-m", "harness", "bench", "--impls", "ours", "--warm-cache", *bench_args,
               "--out", str(out)] + (["--kernels"] if kernels else [])
    subprocess.run(command, cwd=tree, env=env_for(tree), check=True, stdout=subprocess.DEVNULL)


def summary(out: Path, rounds: int) -> str:
    """Markdown: the phases' medians (ms) per op, tree and round, then per op and kernel the first
    round's ms in the base and in this tree, longest first."""
    runs = [(tree, r) for r in range(1, rounds + 1) for tree in ("base", "tree")]
    medians = {}
    for tree, r in runs:
        rows = pd.read_csv(out / f"{tree}-{r}" / "bench.csv")
        rows = rows[rows["phase"].isin(PHASES)]
        for (op, variant, phase), median in rows.groupby(["op", "variant", "phase"])["median_ms"].first().items():
            medians.setdefault((op, variant, phase), {})[f"{tree} {r}"] = median
    header = ["op", "variant", "phase", *(f"{tree} {r}" for tree, r in runs)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 3 + "---:|" * len(runs)]
    for (op, variant, phase), by_run in sorted(medians.items()):
        lines.append(f"| {op} | {variant} | {phase} | "
                     + " | ".join(f"{by_run.get(h, float('nan')):.3f}" for h in header[3:]) + " |")
    kernels = {tree: out / f"{tree}-1" / "kernels.csv" for tree in ("base", "tree")}
    if all(path.exists() and path.stat().st_size for path in kernels.values()):
        per = {tree: pd.read_csv(path).groupby(["op", "kernel"])["ms"].sum() for tree, path in kernels.items()}
        both = pd.DataFrame(per).fillna(0.0).reset_index()
        if len(both):
            lines += ["", "| op | kernel | base ms | tree ms |", "|---|---|---:|---:|"]
        for _, row in both.sort_values(["op", "base"], ascending=[True, False]).iterrows():
            lines.append(f"| {row['op']} | `{row['kernel'][:60]}` | {row['base']:.3f} | {row['tree']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the other checkout (a folder with fla_kernels/, harness/)")
    parser.add_argument("--out", required=True, help="folder for each run's results and summary.md")
    parser.add_argument("--rounds", type=int, default=2, help="base and this tree this many times each (default 2)")
    args, bench_args = parser.parse_known_args(argv)
    if not os.path.isdir(os.path.join(args.base, "harness")):
        parser.error("--base must name a checkout holding harness/")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    out = Path(args.out)
    for r in range(1, args.rounds + 1):
        for tree, folder in (("base", args.base), ("tree", str(HERE))):
            bench_in(folder, (out / f"{tree}-{r}").resolve(), bench_args, kernels=r == 1)
            print(f"{tree} round {r} done", flush=True)
    text = summary(out, args.rounds)
    (out / "summary.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
