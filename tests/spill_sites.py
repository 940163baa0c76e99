"""Where a compiled kernel spills: its cubin, assembled with line information, disassembled, and
each local-memory store and load (STL, LDL: ptxas' spills) counted at the source line the
disassembler names for it. The line is the innermost one (a helper's, where the spilled value was
made or read inside a called @triton.jit function): nvdisasm has no inlining chain for Triton's
PTX."""
from __future__ import annotations

import collections
import re
import subprocess

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


def top_sites(cubin: str, nvdisasm: str, count: int = 8) -> list[list]:
    """The count source lines of cubin (assembled with -lineinfo) with the most spill instructions,
    as [path, line, instructions]."""
    sass = subprocess.run([nvdisasm, "--print-line-info", cubin], check=True, capture_output=True,
                          text=True).stdout
    return [[path, line, n] for (path, line), n in spill_lines(sass).most_common(count)]
