"""Wall time of the float64 golden (forward and backward, chunked form) and of the same-dtype baseline.

    python benchmarks/golden_time.py [--op gla,rwkv6] [--T 43884] [--repeat 5]

Medians of `--repeat` timed runs after one warm-up, per op, at B=1, H=1, K=V=64, bf16 inputs,
initial state with gradient (the issue's long-sequence shape).
"""
import argparse
import functools
import statistics
import time

import torch

from harness.cases import Case
from harness.inputs import make_inputs
from harness.declaration import load_function
from harness.registry import get_op
from harness.execution import execute


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeat):
    fn()
    _sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--op", default="gla,rwkv6")
    parser.add_argument("--T", type=int, default=43884)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for op in args.op.split(","):
        spec = get_op(op)
        case = Case(op=op, dtype="bf16", B=1, T=args.T, H=1, K=64, V=64, h0="grad", gate="normal",
                    seed=0, **{s: 64 for s in spec.symbols})
        inputs = make_inputs(spec, case, device)
        chunked = load_function(spec.reference_chunked)
        golden = timed(lambda: execute(chunked, spec, case, inputs, to_dtype=torch.float64), args.repeat)
        baseline_fn = functools.partial(chunked, operand_dtype=case.torch_dtype,
                                        chunk_size=spec.baseline_chunk_size)
        baseline = timed(lambda: execute(baseline_fn, spec, case, inputs), args.repeat)
        print(f"{op}: T={args.T} float64 golden fwd+bwd median {golden:.3f} s; "
              f"bf16 baseline fwd+bwd median {baseline:.3f} s ({device})", flush=True)


if __name__ == "__main__":
    main()
