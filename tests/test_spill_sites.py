"""`kernel_resources --where` (tests/spill_sites.py): the source lines a kernel spills at, read off
its disassembly; tested on made-up disassembly and on a kernel compiled for sm_90 that must spill
(four [64, 64] float32 tiles live at once in one warp: 512 registers a thread) beside one that
must not."""
import fla_kernels  # noqa: F401  (sets the interpreter up before triton is imported)
import inspect
import os

import torch
import triton
import triton.language as tl

from tests.gpu_compile import compile_records, recording_launches
from tests.spill_sites import spill_lines

SASS = """
	//## File "/src/kernel.py", line 10
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1+0x8], R4 ;
        /*0020*/                   STL.64 [R1+0x10], R6 ;
	//## File "/src/helpers.py", line 3
        /*0030*/                   LDG.E R8, desc[UR4][R2.64] ;
        /*0040*/                   STS [R9], R8 ;
        /*0050*/                   LDS R10, [R9] ;
        /*0060*/                   LDSM.16.M88.4 R12, [R9] ;
        /*0070*/                   LDL.LU R4, [R1+0x8] ;
	//## File "/src/kernel.py", line 10
        /*0080*/                   LDL.64 R6, [R1+0x10] ;
"""


def test_spill_instructions_count_at_their_source_line():
    """STL and LDL (any width or cache suffix) count at the line annotated above them; global,
    shared and matrix loads and stores do not count."""
    assert spill_lines(SASS) == {("/src/kernel.py", 10): 3, ("/src/helpers.py", 3): 1}
    assert spill_lines(SASS.replace("STL", "STS").replace("LDL", "LDS")) == {}


@triton.jit
def _live_tiles_kernel(x, y, TILES: tl.constexpr, BLOCK: tl.constexpr):
    """TILES [BLOCK, BLOCK] tiles loaded, each written back plus the sum of their products: all of
    them live at once."""
    o = tl.arange(0, BLOCK)
    offs = o[:, None] * BLOCK + o[None, :]
    a = tl.load(x + offs)
    b = tl.load(x + BLOCK * BLOCK + offs)
    c = tl.load(x + 2 * BLOCK * BLOCK + offs)
    d = tl.load(x + 3 * BLOCK * BLOCK + offs)
    if TILES == 4:
        s = a * b + c * d
        tl.store(y + offs, a + s)
        tl.store(y + BLOCK * BLOCK + offs, b + s)
        tl.store(y + 2 * BLOCK * BLOCK + offs, c + s)
        tl.store(y + 3 * BLOCK * BLOCK + offs, d + s)
    else:
        tl.store(y + offs, a)


def test_a_kernel_that_spills_names_its_lines_and_one_that_does_not_names_none():
    """Compiled for sm_90 as launched: the spilling kernel's sites are lines of its own source;
    the kernel that holds one tile has no spills and no sites."""
    x, y = torch.zeros(4 * 64 * 64), torch.zeros(4 * 64 * 64)
    with recording_launches() as records:
        _live_tiles_kernel[(1,)](x, y, TILES=4, BLOCK=64, num_warps=1)
        _live_tiles_kernel[(1,)](x, y, TILES=1, BLOCK=64, num_warps=1)
    spilling, plain = compile_records(records, resources=True, sites=True)
    lines, first = inspect.getsourcelines(_live_tiles_kernel.fn)
    own = range(first, first + len(lines))
    here = os.path.basename(__file__)   # Triton's cache keeps the path of the checkout that compiled it first
    assert spilling["ok"] and spilling["spill_stores"] > 0, spilling
    assert spilling["spill_sites"] and all(os.path.basename(path) == here and line in own
                                           for path, line, _ in spilling["spill_sites"]), spilling["spill_sites"]
    assert plain["ok"] and plain["spill_stores"] == 0 and "spill_sites" not in plain, plain
