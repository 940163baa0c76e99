"""Per-kernel device times of the chunked delta-rule kernels under launch settings (a GPU
benchmark; the table in benchmarks/tuning.md, 2026-11-27, came from it).

    python benchmarks/delta_launch_settings.py OP OUT.csv    (OP: delta_rule, gated_delta_rule, kda)

At B=8, T=4096, H=16, K=V=128, bf16, one forward+backward is profiled per kernel (the torch
profiler, `harness.kernel_profile`) first under `_settings`' own choice, then with every kernel of
chunk_delta.py and chunk_pairs.py launched under one (V-block width, num_warps, num_stages). A
kernel that does not compile under a setting runs under its own and is marked failed in the CSV.
"""
import csv
import sys

import torch
import torch.nn.functional as F

from fla_kernels.ops.common import chunk_delta
from fla_kernels.ops.delta_rule.chunk import chunk_delta_rule
from fla_kernels.ops.gated_delta_rule.chunk import chunk_gated_delta_rule
from fla_kernels.ops.kda.chunk import chunk_kda
from harness.kernel_profile import device_events, per_pass

SETTINGS = ([(32, warps, stages) for warps in (4, 8, 16) for stages in (1, 2)]
            + [(64, warps, stages) for warps in (4, 8) for stages in (1, 2)])
B, T, H, K, V = 8, 4096, 16, 128, 128


def inputs(device="cuda", dtype=torch.bfloat16):
    """Unit keys, beta from a sigmoid, weak decay: the inputs layers give these kernels."""
    torch.manual_seed(0)
    return dict(
        q=torch.randn(B, T, H, K, device=device, dtype=dtype, requires_grad=True),
        k=F.normalize(torch.randn(B, T, H, K, device=device), dim=-1).to(dtype).requires_grad_(),
        v=torch.randn(B, T, H, V, device=device, dtype=dtype, requires_grad=True),
        beta=torch.randn(B, T, H, device=device).sigmoid().to(dtype).requires_grad_(),
        g=(-0.1 * torch.rand(B, T, H, device=device)).requires_grad_(),
        gk=(-0.1 * torch.rand(B, T, H, K, device=device)).requires_grad_(),
        do=torch.randn(B, T, H, V, device=device, dtype=dtype))


def step_of(op: str, x: dict):
    """One forward+backward of `op` on x."""
    def step():
        if op == "delta_rule":
            o, _ = chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"])
        elif op == "gated_delta_rule":
            o, _ = chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])
        else:
            o, _ = chunk_kda(x["q"], x["k"], x["v"], x["gk"], x["beta"])
        o.backward(x["do"])
    return step


def main(op: str, out: str):
    step = step_of(op, inputs())
    own_settings, own_launch = chunk_delta._settings, chunk_delta.launch
    failed = set()

    def launch_under(BV, warps, stages):
        def launch(kernel, grid, *args, **kwargs):
            try:
                return own_launch(kernel, grid, *args, **{**kwargs, "num_warps": warps, "num_stages": stages})
            except Exception:   # out of shared memory or registers: the kernel's own setting
                failed.add(kernel.fn.__name__)
                return own_launch(kernel, grid, *args, **kwargs)
        return launch

    def settings_under(BV):
        def settings(K, dtype, channel):
            BK, chosen = own_settings(K, dtype, channel)
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
                chunk_delta._settings = settings_under(setting[0])
                chunk_delta.launch = launch_under(*setting)
            label = setting or ("own", "own", "own")
            for row in per_pass(device_events(step)):
                writer.writerow([op, *label, row["kernel"][:60], f"{row['ms']:.4f}", row["kernel"] in failed])
            f.flush()
            print(op, label, "failed:", sorted(failed), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
