"""Pipeline races (tests/pipeline_races.py) in every kernel an op's implementation launches, compiled
for Hopper (sm_90a) on the CPU with this machine's Triton, no GPU needed: ours, or an
implementation set's (`--impl fla`), whose autotuned kernels are compiled under every one of their
configs, since the GPU's autotuner may pick any of them.

    python -m benchmarks.pipeline_races --op kda,gla [--impl fla] [--dtype bf16] [--K 64,128]

One line per compiled specialisation: ok, RACE with the first stale read, or ERROR with the compile
error's innermost cause.
"""
import argparse
import contextlib
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton: launches are recorded, not run

import torch  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402

from harness import interpreted_upstream  # noqa: E402
from harness.cases import Case  # noqa: E402
from harness.execution import execute  # noqa: E402
from harness.inputs import make_inputs  # noqa: E402
from harness.registry import OPS  # noqa: E402
from harness.upstream import set_function  # noqa: E402
from tests.gpu_compile import compile_records, distinct, recording_launches  # noqa: E402


@contextlib.contextmanager
def every_config():
    """An autotuned kernel's launch runs (so is recorded) under each of its configs."""
    def run(self, *args, **kwargs):
        for config in self.configs:
            self.fn.run(*args, **{**kwargs, **config.all_kwargs()})
    saved = Autotuner.run
    Autotuner.run = run
    try:
        yield
    finally:
        Autotuner.run = saved


def implementations(spec, impl: str) -> dict:
    """{variant: function} of ours or of implementation set `impl`."""
    if impl == "ours":
        return {variant: spec.variant_fn(variant) for variant in spec.variants}
    return {variant: set_function(target, spec) for variant, target in spec.upstream.get(impl, {}).items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", required=True, help="op(s), comma-separated")
    parser.add_argument("--impl", default="ours", help="ours (default) or an implementation set, e.g. fla")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--K", default="64,128", help="head dims (K = V), comma-separated")
    args = parser.parse_args()
    interpreted_upstream.prepare()
    records = []
    for op in args.op.split(","):
        spec = OPS[op]
        for variant, fn in implementations(spec, args.impl).items():
            for K in map(int, args.K.split(",")):
                case = Case(op=op, dtype=args.dtype, B=1, T=130, H=2, K=K, V=K, h0="grad", gate="strong",
                            seed=0, **{s: 64 for s in spec.symbols})
                with recording_launches() as launched, every_config():
                    try:
                        execute(fn, spec, case, make_inputs(spec, case, torch.device("cpu")))
                    except Exception as exc:   # a function without a backward still has its forward
                        print(f"{op} {variant} K={K}: {type(exc).__name__}: {exc}"[:200], file=sys.stderr)
                records += [dict(r, op=op, variant=variant) for r in launched]
    records = distinct(records)
    print(f"{len(records)} specialisations", file=sys.stderr, flush=True)
    for r, done in zip(records, compile_records(records, timeout=24 * 3600)):
        verdict = "ok" if done["ok"] else "RACE" if done["error"].startswith("PipelineRace") else "ERROR"
        lines = done.get("error", "").splitlines() or [""]
        why = lines[0] if verdict == "RACE" else lines[-1].strip()   # a compile error's innermost cause
        print(f"{verdict:5} {r['op']} {r['variant']} {r['name']} {r['options']} {why[:300]}", flush=True)


if __name__ == "__main__":
    main()
