"""`python -m benchmarks.ab_bits`: a base tree that is this one gives every tensor the same bit for
bit; one with a planted change in the chunked delta rule's backward (dTi scaled by 1.0001) gives
other gradients and the same output."""
import shutil

from benchmarks.ab_bits import main

TREE = ("fla_kernels", "harness", "references", "reports")


def _copy(root, dest, plant=False):
    for name in TREE:
        shutil.copytree(root / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    if plant:
        path = dest / "fla_kernels" / "ops" / "common" / "chunk_delta.py"
        text = path.read_text()
        assert text.count("b_dT = b_dT * b_beta[None, :]") == 1
        path.write_text(text.replace("b_dT = b_dT * b_beta[None, :]", "b_dT = b_dT * (b_beta[None, :] * 1.0001)"))


def test_the_same_tree_is_the_same_and_a_planted_change_is_not(tmp_path, capsys):
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    args = ["--op", "delta_rule", "--variant", "chunk", "--dtype", "fp32", "--shapes", "20x16x8"]
    _copy(root, tmp_path / "same")
    assert main(["--base", str(tmp_path / "same"), *args]) == 0
    assert "7 tensors; 0 not the same bit for bit" in capsys.readouterr().out
    _copy(root, tmp_path / "planted", plant=True)
    assert main(["--base", str(tmp_path / "planted"), *args]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if ": max |difference|" in line]
    names = {line.split(":")[0].rsplit("/", 1)[1] for line in lines}
    assert "dbeta" in names and "dk" in names and not names & {"o", "ht"}, lines
