"""`python -m benchmarks.ab_bench`: a base tree and this one benched alternately, every phase's
median per tree and round in the summary, and per kernel both trees' times (from made-up runs:
the kernel split needs a GPU)."""
import pandas as pd

from benchmarks.ab_bench import main, summary
from benchmarks.checkouts import copy_code


def test_both_trees_are_benched_and_summed_up(tmp_path, capsys):
    out = tmp_path / "ab"
    assert main(["--base", str(copy_code(tmp_path / "base")), "--out", str(out), "--rounds", "1", "--op", "rwkv6",
                 "--variant", "fused_recurrent", "--B", "1", "--T", "20", "--H", "1", "--K", "16", "--V", "16"]) == 0
    rows = [line for line in (out / "summary.md").read_text().splitlines() if line.startswith("| rwkv6 |")]
    assert [line.split(" | ")[2] for line in rows] == ["fwd", "fwd+bwd"]
    assert all(float(x) > 0 for line in rows for x in line.strip(" |").split(" | ")[3:]), rows
    assert "| rwkv6 | fused_recurrent | fwd |" in capsys.readouterr().out


def _run(folder, medians, kernels):
    folder.mkdir(parents=True)
    pd.DataFrame([{"op": "gla", "variant": "chunk", "phase": phase, "median_ms": ms}
                  for phase, ms in medians.items()]).to_csv(folder / "bench.csv", index=False)
    pd.DataFrame([{"op": "gla", "kernel": name, "ms": ms} for name, ms in kernels.items()]).to_csv(
        folder / "kernels.csv", index=False)


def test_the_summary_has_each_round_and_each_kernel(tmp_path):
    _run(tmp_path / "base-1", {"first fwd": 900.0, "fwd": 1.5, "fwd+bwd": 5.0}, {"_walk": 0.5, "_out": 0.4})
    _run(tmp_path / "tree-1", {"fwd": 1.4, "fwd+bwd": 4.5}, {"_walk": 0.3, "_new": 0.1})
    _run(tmp_path / "base-2", {"fwd": 1.6, "fwd+bwd": 5.1}, {})
    _run(tmp_path / "tree-2", {"fwd": 1.3, "fwd+bwd": 4.4}, {})
    text = summary(tmp_path, 2).splitlines()
    assert text[0] == "| op | variant | phase | base 1 | tree 1 | base 2 | tree 2 |"
    assert "| gla | chunk | fwd | 1.500 | 1.400 | 1.600 | 1.300 |" in text
    assert "| gla | chunk | fwd+bwd | 5.000 | 4.500 | 5.100 | 4.400 |" in text
    assert not any("first fwd" in line for line in text)
    kernels = text[text.index("| op | kernel | base ms | tree ms |") + 2:]
    assert kernels == ["| gla | `_walk` | 0.500 | 0.300 |", "| gla | `_out` | 0.400 | 0.000 |",
                       "| gla | `_new` | 0.000 | 0.100 |"]
