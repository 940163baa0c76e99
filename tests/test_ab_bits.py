"""`python -m benchmarks.ab_bits`: a base tree that is this one gives every tensor the same bit for
bit; one with a planted change in the chunked delta rule's backward (dTi scaled by 1.0001) gives
other gradients and the same output."""
from benchmarks.ab_bits import main
from benchmarks.checkouts import copy_code


def _planted(dest):
    """This checkout's code in dest with dTi scaled by 1.0001 in the chunked delta rule's backward."""
    path = copy_code(dest) / "fla_kernels" / "ops" / "common" / "chunk_delta.py"
    text = path.read_text()
    assert text.count("b_dT = b_dT * b_beta[None, :]") == 1
    path.write_text(text.replace("b_dT = b_dT * b_beta[None, :]", "b_dT = b_dT * (b_beta[None, :] * 1.0001)"))
    return dest


def test_the_same_tree_is_the_same_and_a_planted_change_is_not(tmp_path, capsys):
    args = ["--op", "delta_rule", "--variant", "chunk", "--dtype", "fp32", "--shapes", "20x16x8"]
    assert main(["--base", str(copy_code(tmp_path / "same")), *args]) == 0
    assert "7 tensors; 0 not the same bit for bit" in capsys.readouterr().out
    assert main(["--base", str(_planted(tmp_path / "planted")), *args]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if ": max |difference|" in line]
    names = {line.split(":")[0].rsplit("/", 1)[1] for line in lines}
    assert "dbeta" in names and "dk" in names and not names & {"o", "ht"}, lines
