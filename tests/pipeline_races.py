"""Reads of a pipelined shared-memory buffer that the next stage's copy may already overwrite, found
in a kernel's TTGIR (Triton's GPU IR, after software pipelining).

Triton pipelines a loop's loads (num_stages >= 2) into a ring of shared-memory buffers: each
iteration reads its stage's buffer, then issues the copy for a later iteration into the buffer it
frees. Where a loaded tile is also used inside a branch of the loop body, the pipeliner (Triton
3.6 and 3.9) can place that use after the issued copy, still reading the buffer being refilled
(the race triton-lang/triton#8139 describes, whose fix gives such loads an extra buffer). A kda
pairs kernel in 16-row programs did that on an H100: its column loop, taken when a block decays
steeply, re-read the block's gates after the copy into their buffer, and every case from K = 48
(two or more key blocks) failed o by 100-1000 times its bound, while the interpreter passed
(benchmarks/tuning.md, 2026-11-28). Such a read is found here on the CPU, from the compiled text.
"""
from __future__ import annotations

import re

_VALUE = r"%[\w.#]+"
_RING = re.compile(rf"({_VALUE}) = ttg\.local_alloc : \(\) -> !ttg\.memdesc<(\d+)x[^>]*mutable>")
_INDEX = re.compile(rf"({_VALUE}) = ttg\.memdesc_index ({_VALUE})\[")
_COPY = re.compile(rf"ttg\.async_copy_global_to_local {_VALUE}, ({_VALUE})")
_READ = re.compile(rf"ttg\.local_load ({_VALUE}) token")
_LOOP = re.compile(r"= scf\.for ")


def stale_reads(ttgir: str) -> list[str]:
    """The pipelined reads (`ttg.local_load ... token`) of `ttgir` that come after a copy into the
    same buffer ring in the body of a loop enclosing them, where the ring has no more buffers than
    the copies issued into it ahead of that loop (the stages in flight, so the copy refills the
    buffer being read; a ring with a buffer more, as triton-lang/triton#8139's fix gives such
    loads, is safe), as "line N: <op>"; none in a correct pipeline."""
    slots: dict[str, int] = {}     # a ring of buffers (mutable local_alloc) -> its number of buffers
    ring_of: dict[str, str] = {}   # a buffer view (memdesc_index) -> the ring it indexes
    ahead: dict[tuple[str, int], int] = {}   # (ring, loop depth) -> copies into it at that depth
    loops: list[tuple[int, set[str]]] = []   # (indent of each enclosing scf.for, rings copied into)
    found = []
    for number, line in enumerate(ttgir.splitlines(), 1):
        text, indent = line.strip(), len(line) - len(line.lstrip())
        while loops and text.startswith("}") and indent <= loops[-1][0]:
            loops.pop()
        if ring := _RING.search(text):
            slots[ring.group(1)] = int(ring.group(2))
        if index := _INDEX.search(text):
            ring_of[index.group(1)] = index.group(2)
        if _LOOP.search(text):
            loops.append((indent, set()))
            continue
        if copy := _COPY.search(text):
            ring = ring_of.get(copy.group(1), copy.group(1))
            ahead[ring, len(loops)] = ahead.get((ring, len(loops)), 0) + 1
            if loops:
                loops[-1][1].add(ring)
        if (read := _READ.search(text)) and read.group(1) in ring_of:
            ring = ring_of[read.group(1)]
            for depth, (_, copied) in enumerate(loops, 1):
                in_flight = ahead.get((ring, depth - 1), 0)
                if ring in copied and slots.get(ring, 0) <= in_flight:
                    found.append(f"line {number}: {text[:160]}")
                    break
    return found
