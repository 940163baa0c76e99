"""FLA_EMULATE_TENSOR_CORES: the interpreter rounds 16-bit operands as the tensor cores read them,
so a CPU run sees the bias one such rounding leaves in a gate gradient's sums. The three kernels
fixed for it on the H100 pass there, and each of them with its split products planted back to
one rounding fails its dg sums, and only them."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def emulated(*args):
    env = dict(os.environ, TRITON_INTERPRET="1", FLA_EMULATE_TENSOR_CORES="1", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-m", "tests.emulated_tensor_cores", *args], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_products_round_their_operands_to_the_operand_dtype():
    for dtype, (from_rounded, from_exact) in emulated("products").items():
        assert from_rounded < 1e-5, dtype          # the exact product of the rounded operands
        assert from_exact > 1e-3, dtype            # and not the exact product of the inputs


# the H100 cases the sums failed on before, and the products each kernel's split ones replaced
CASES = [("gla", "fused_chunk", "bf16", 65, "strong", "bf16"),
         ("simple_gla", "chunk", "fp16", 65, "normal", "tf32"),
         ("gsa", "chunk", "fp16", 65, "normal", "tf32")]


@pytest.mark.parametrize("op, variant, dtype, T, gate, plain", CASES)
def test_gate_gradient_sums_pass_with_split_products_and_fail_with_one_rounding(op, variant, dtype,
                                                                                 T, gate, plain):
    args = (op, variant, dtype, str(T), gate)
    rows = emulated("sums", *args, "ours")
    assert set(rows) == {"dg", "dg (sum over t)", "dg (sum over b, t, h)"}
    assert all(verdict == "PASS" for verdict, _ in rows.values()), rows
    rows = emulated("sums", *args, plain)
    assert rows["dg"][0] == "PASS", rows          # every element still inside its bound
    failing = {t for t, (verdict, _) in rows.items() if verdict == "FAIL"}
    assert failing and failing <= {"dg (sum over t)", "dg (sum over b, t, h)"}, rows
    assert all(rows[t][1].startswith("the sum over ") for t in failing)
