"""Registers and spills of every kernel an op's variants launch, compiled for Hopper (sm_90a) on
the CPU, no GPU needed. A kernel at the 255-register ceiling spills its tiles to local memory,
and the spills are where its time goes (benchmarks/tuning.md, 2026-11-27).

    python -m benchmarks.kernel_resources --op delta_rule,kda --variant chunk --dtype bf16 --K 128 --V 128

Launches are recorded under the interpreter as the sm_90 compile test records them
(tests/gpu_compile.py), then each distinct specialisation is compiled and ptxas reports it:
registers, spill stores and loads (bytes per thread), shared memory (bytes per block); with
--asm DIR also its TTGIR and PTX, to read what a change did to the loads and the products; with
--where N, under each kernel that spills, the N source lines with the most spill instructions
(tests/spill_sites.py: the innermost line, often a helper's). Each kernel's programs a launch
(the most of its launches at --B, --T, --H), how many one SM holds and what limits it, and the
waves on --sms SMs (benchmarks/occupancy.py): at the bench shape (--B 8 --T 4096 --H 16),
launches are recorded without running, so a large shape costs only its tensors' memory.
"""
import argparse
import linecache
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton: launches are recorded, not run

import torch  # noqa: E402

from harness.cases import Case  # noqa: E402
from harness.execution import execute  # noqa: E402
from harness.inputs import make_inputs  # noqa: E402
from harness.registry import OPS  # noqa: E402
from benchmarks.occupancy import HOPPER, programs_per_sm, waves  # noqa: E402
from tests.gpu_compile import compile_records, distinct, recording_launches  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", required=True, help="op(s), comma-separated")
    parser.add_argument("--variant", help="variants (default: all of the op)")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--B", type=int, default=1)
    parser.add_argument("--T", type=int, default=130)
    parser.add_argument("--H", type=int, default=2)
    parser.add_argument("--sms", type=int, default=HOPPER["sms"], help="SMs the waves are counted on")
    parser.add_argument("--K", type=int, default=128)
    parser.add_argument("--V", type=int, default=128)
    parser.add_argument("--M", type=int, default=64, help="slots per head (gsa)")
    parser.add_argument("--asm", metavar="DIR", help="also write each kernel's TTGIR and PTX into DIR/OP-VARIANT/")
    parser.add_argument("--where", type=int, default=0, metavar="N",
                        help="also the N source lines each spilling kernel spills at most")
    args = parser.parse_args()
    print("op variant kernel num_warps num_stages registers spill_stores spill_loads shared programs "
          "per_sm limit waves")
    for op in args.op.split(","):
        spec = OPS[op]
        for variant in args.variant.split(",") if args.variant else spec.variants:
            case = Case(op=op, dtype=args.dtype, B=args.B, T=args.T, H=args.H, K=args.K, V=args.V, h0="grad",
                        gate="normal", seed=0, **{s: args.M for s in spec.symbols})
            with recording_launches() as records:
                execute(spec.variant_fn(variant), spec, case, make_inputs(spec, case, torch.device("cpu")))
            asm_dir = os.path.join(args.asm, f"{op}-{variant}") if args.asm else None
            for r in compile_records(distinct(records), resources=True, asm_dir=asm_dir, sites=args.where > 0):
                options = r.get("options", {})
                print(op, variant, r["name"], options.get("num_warps"), options.get("num_stages"),
                      r.get("registers"), r.get("spill_stores"), r.get("spill_loads"), r.get("shared"),
                      *_occupancy(r, args.sms), "" if r["ok"] else r["error"].splitlines()[0], flush=True)
                for path, line, n in r.get("spill_sites", [])[:args.where]:
                    print(f"    {n:4d} at {os.path.basename(path)}:{line}: {linecache.getline(path, line).strip()}")


def _occupancy(r: dict, sms: int) -> tuple:
    """(programs, programs an SM holds, what limits it, waves) of a compiled record; blanks where
    it did not compile."""
    if r.get("registers") is None or r.get("shared") is None:
        return r.get("programs"), "", "", ""
    per_sm, limit = programs_per_sm(r["registers"], r["options"].get("num_warps", 4), r["shared"])
    return r["programs"], per_sm, limit.replace(" ", "_"), f"{waves(r['programs'], per_sm, sms):.2f}"


if __name__ == "__main__":
    main()
