"""Where a compiled kernel spills: its PTX assembled with line information, disassembled, and each
local-memory store and load (STL, LDL: ptxas' spills) counted at the source line the
disassembler names for it. The line is the innermost one (a helper's, where the spilled value was
made or read inside a called @triton.jit function): nvdisasm has no inlining chain for Triton's
PTX."""
from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile

_LOCATION = re.compile(r'//## File "([^"]+)", line (\d+)')
_SPILL = re.compile(r"\b(STL|LDL)(\.\w+)*\s")


def spill_lines(sass: str) -> collections.Counter:
    """{(path, line): spill instructions (STL and LDL) at it} of nvdisasm --print-line-info output;
    instructions before any line annotation count at ("?", 0)."""
    counts = collections.Counter()
    where = ("?", 0)
    for text in sass.splitlines():
        if m := _LOCATION.search(text):
            where = (m.group(1), int(m.group(2)))
        elif _SPILL.search(text):
            counts[where] += 1
    return counts


def disassembly(ptx: str, arch: int, ptxas: str) -> str:
    """The SASS of ptx for sm_<arch>a with source lines, from ptxas and the nvdisasm beside it."""
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        subprocess.run([ptxas, "--gpu-name", f"sm_{arch}a", "-lineinfo", src, "-o", cubin], check=True,
                       capture_output=True)
        nvdisasm = os.path.join(os.path.dirname(ptxas), "nvdisasm")
        return subprocess.run([nvdisasm, "--print-line-info", cubin], check=True, capture_output=True,
                              text=True).stdout


def top_sites(ptx: str, arch: int, ptxas: str, count: int = 8) -> list[list]:
    """The count source lines with the most spill instructions, as [path, line, instructions]."""
    return [[path, line, n] for (path, line), n in
            spill_lines(disassembly(ptx, arch, ptxas)).most_common(count)]
