"""Per-kernel device times of the chunked delta-rule kernels under launch settings (a GPU
benchmark; the table in benchmarks/tuning.md, 2026-11-27, came from its first form, which drew
unit keys, a sigmoid beta and weak decay by hand instead of the bench's inputs).

    python benchmarks/delta_launch_settings.py OP OUT.csv    (OP: delta_rule, gated_delta_rule, kda)

At the delta-rule issue's bench shape (B=8, T=4096, H=16, K=V=128, bf16, the bench's inputs), our
chunk variant's forward+backward is profiled per kernel as `bench --kernels` does it
(`harness.bench.kernel_rows`): first under `_settings`' own choice, then with every kernel of
chunk_delta.py and chunk_pairs.py launched under one (V-block width, num_warps, num_stages). A
kernel that does not compile under a setting runs under its own and is marked failed.
"""
import csv
import sys

import torch

from fla_kernels.ops.common import chunk_delta
from harness.bench import candidates, kernel_rows
from harness.cases import Case
from harness.inputs import make_inputs
from harness.registry import OPS
from reports.schema import SHAPE as AXES

SETTINGS = ([(32, warps, stages) for warps in (4, 8, 16) for stages in (1, 2)]
            + [(64, warps, stages) for warps in (4, 8) for stages in (1, 2)])
SHAPE = dict(B=8, T=4096, H=16, K=128, V=128)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def main(op: str, out: str):
    spec = OPS[op]
    dims = {axis: SHAPE.get(axis, 0) if axis in spec.used_symbols() else 0 for axis in AXES}
    case = Case(op=op, dtype="bf16", h0="none", gate="normal", seed=0, **dims)
    (ours,) = candidates(spec, ["chunk"], ["ours"])
    inputs = make_inputs(spec, case, DEVICE)
    own_settings, own_launch = chunk_delta._settings, chunk_delta.launch
    failed = set()

    def launch_under(warps, stages):
        def launch(kernel, grid, *args, **kwargs):
            try:
                return own_launch(kernel, grid, *args, **{**kwargs, "num_warps": warps, "num_stages": stages})
            except Exception:   # out of shared memory or registers: the kernel's own setting
                failed.add(kernel.fn.__name__)
                return own_launch(kernel, grid, *args, **kwargs)
        return launch

    def settings_under(BV):
        def settings(*args):
            BK, chosen = own_settings(*args)
            return BK, {name: {**s, "BV": BV} if "BV" in s else s for name, s in chosen.items()}
        return settings

    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["op", "BV", "warps", "stages", "kernel", "ms", "failed"])
        for setting in [None] + SETTINGS:
            failed.clear()
            if setting is None:
                chunk_delta._settings, chunk_delta.launch = own_settings, own_launch
            else:
                chunk_delta._settings, chunk_delta.launch = settings_under(setting[0]), launch_under(*setting[1:])
            label = setting or ("own", "own", "own")
            for row in kernel_rows(ours, inputs):
                writer.writerow([op, *label, row["kernel"][:60], f"{row['ms']:.4f}", row["kernel"] in failed])
            f.flush()
            print(op, label, "failed:", sorted(failed), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
