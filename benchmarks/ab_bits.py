"""Whether a kernel change left every output and gradient the same bit for bit: each op's variants
run forward and backward on fixed small cases, once in a base tree (another checkout, with its own
code first on the path) and once in this one, and every tensor is compared.

    TRITON_INTERPRET=1 FLA_EMULATE_TENSOR_CORES=1 python -m benchmarks.ab_bits --base DIR \\
        --op delta_rule,gated_delta_rule,kda --variant chunk

On the CPU, emulated tensor cores round every product's operands as the GPU's do, so a change
that only moves values (a shorter live range, a tile stored as its product reads it) must keep
every bit; without them the interpreter's products are IEEE fp32. On a GPU it compares what the
GPU computes. Exit status 1 when any tensor differs (NaN matches NaN; -0 matches 0).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import torch

SHAPES = "130x100x64,70x64x32"   # T x K x V: two chunks and a partial third, heads not a power of two


def cases(ops, variants, dtypes, shapes, M=16):
    """(op, variant, Case) of every op's listed variants (all where none are listed) at each dtype
    and T x K x V, B = 1, H = 2, an initial state with its gradient, normal gates, seed 0."""
    from harness.cases import Case
    from harness.registry import OPS
    for op in ops:
        spec = OPS[op]
        for variant in variants or spec.variants:
            if variant not in spec.variants:
                continue
            for dtype in dtypes:
                for shape in shapes:
                    T, K, V = (int(x) for x in shape.split("x"))
                    yield op, variant, Case(op=op, dtype=dtype, B=1, T=T, H=2, K=K, V=V, h0="grad",
                                            gate="normal", seed=0, **{s: M for s in spec.symbols})


def results(ops, variants, dtypes, shapes) -> dict:
    """{"op/variant/case id/tensor": tensor on the CPU} of every case's outputs and gradients, from
    the harness's case core in the tree this process imports."""
    from harness.execution import execute
    from harness.inputs import make_inputs
    from harness.registry import OPS
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    found = {}
    for op, variant, case in cases(ops, variants, dtypes, shapes):
        spec = OPS[op]
        out = execute(spec.variant_fn(variant), spec, case, make_inputs(spec, case, device))
        for name, x in out.items():
            if x is not None:
                found[f"{op}/{variant}/{case.case_id}/{name}"] = x.detach().cpu()
        print(op, variant, case.case_id, flush=True)
    return found


def saved_in(tree: str, out: str, args) -> None:
    """Run `results` in a fresh process whose imports come from tree, saved to out (this file runs
    there as a script: the base need not have it)."""
    from benchmarks.checkouts import env_for
    command = [sys.executable, os.path.abspath(__file__), "--save", out, "--op", args.op,
               "--dtype", args.dtype, "--shapes", args.shapes] + (["--variant", args.variant] if args.variant else [])
    subprocess.run(command, cwd=tree, env=env_for(tree), check=True)


def differences(base: dict, tree: dict) -> list[str]:
    """One line for each tensor that is not the same in both (or is in one only)."""
    lines = []
    for key in sorted(set(base) | set(tree)):
        if key not in base or key not in tree:
            lines.append(f"{key}: only in {'the base' if key in base else 'this tree'}")
            continue
        a, b = base[key], tree[key]
        if a.shape != b.shape or a.dtype != b.dtype:
            lines.append(f"{key}: {tuple(a.shape)} {a.dtype} against {tuple(b.shape)} {b.dtype}")
        elif not bool(((a == b) | (a.isnan() & b.isnan())).all()):
            diff = (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item()
            lines.append(f"{key}: max |difference| {diff:.3g}, max |base| {a.double().abs().max().item():.3g}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the other checkout (a folder with fla_kernels/, harness/, references/)")
    parser.add_argument("--op", required=True, help="op(s), comma-separated")
    parser.add_argument("--variant", help="variants, comma-separated (default: all of each op)")
    parser.add_argument("--dtype", default="bf16,fp16,fp32")
    parser.add_argument("--shapes", default=SHAPES, help="T x K x V, comma-separated")
    parser.add_argument("--save", help=argparse.SUPPRESS)   # the child's output
    args = parser.parse_args(argv)
    ops, dtypes, shapes = args.op.split(","), args.dtype.split(","), args.shapes.split(",")
    variants = args.variant.split(",") if args.variant else None
    if args.save:
        torch.save(results(ops, variants, dtypes, shapes), args.save)
        return 0
    if not args.base or not os.path.isdir(os.path.join(args.base, "fla_kernels")):
        parser.error("--base must name a checkout holding fla_kernels/")
    from benchmarks.checkouts import HERE
    with tempfile.TemporaryDirectory() as tmp:
        saved_in(args.base, os.path.join(tmp, "base.pt"), args)
        saved_in(str(HERE), os.path.join(tmp, "tree.pt"), args)
        base, tree = torch.load(os.path.join(tmp, "base.pt")), torch.load(os.path.join(tmp, "tree.pt"))
    lines = differences(base, tree)
    for line in lines:
        print(line)
    print(f"{len(tree)} tensors; {len(lines)} not the same bit for bit")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
