"""How many programs of a kernel one SM holds at once, and in how many waves a launch runs, from
what the compile reports (registers a thread, warps, shared memory a program), as Hopper (sm_90)
allocates them: registers by warp in units of 256, 1 KiB of shared memory reserved a program.
Nsight Compute's occupancy and waves figures for the chunked delta rule's kernels on the H200
agree (benchmarks/tuning.md, fifteenth lease: 255 registers, 4 warps and 94 KB of shared memory,
two programs an SM; 512 programs, 1.94 waves). A launch a little short of two waves takes about
as long as two full ones.
"""
from __future__ import annotations

import math

# H100 SXM and H200: 132 SMs, 64 K registers, 228 KiB of shared memory, 64 warps and 32 programs an SM
HOPPER = dict(sms=132, registers=65536, register_unit=256, warps=64, programs=32, shared=233472,
              reserved_shared=1024)


def programs_per_sm(registers: int, num_warps: int, shared: int, gpu: dict = HOPPER) -> tuple[int, str]:
    """(how many programs of the kernel one SM holds at once, what limits it: registers, shared
    memory, warps or programs, joined by "+" where more than one allows no more)."""
    per_warp = math.ceil(registers * 32 / gpu["register_unit"]) * gpu["register_unit"]
    limits = {"registers": gpu["registers"] // (per_warp * num_warps),
              "shared memory": gpu["shared"] // (shared + gpu["reserved_shared"]),
              "warps": gpu["warps"] // num_warps,
              "programs": gpu["programs"]}
    most = min(limits.values())
    return most, "+".join(name for name, n in limits.items() if n == most)


def waves(programs: int, per_sm: int, sms: int = HOPPER["sms"]) -> float:
    """A launch's programs over what the GPU's SMs hold at once."""
    return programs / (per_sm * sms)
