"""The compile check's pipeline-race scan (tests/pipeline_races.py), both ways: a loop that re-reads
a pipelined tile inside a runtime branch is reported, by the scan and by `compile_records` (so every
kernel of the sm_90 compile test is held to it); the same loop unpipelined, or with the branch using
a value formed before it, is not."""
import pytest
import torch

from tests.gpu_compile import compile_records
from tests.pipeline_races import stale_reads

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="compiles for sm_90 on the CPU, as tests/test_gpu_compile.py")

SIGNATURE = {"a": "*fp32", "b": "*fp32", "out": "*fp32", "flag": "*i32", "K": "constexpr", "BK": "constexpr",
             "REREAD": "constexpr"}


def record(reread: bool, stages: int) -> dict:
    return {"module": "tests.racing_kernels", "name": "branch_after_product", "signature": SIGNATURE,
            "constexprs": {"K": 128, "BK": 32, "REREAD": reread}, "options": {"num_warps": 4, "num_stages": stages}}


def test_a_branch_rereading_a_pipelined_tile_fails_the_compile_check():
    racing, unpipelined, summed = compile_records([record(True, 3), record(True, 1), record(False, 3)])
    assert not racing["ok"] and racing["error"].startswith("PipelineRace: a pipelined shared-memory read "
                                                           "after the copy that refills its buffer"), racing
    assert "ttg.local_load" in racing["error"]
    assert unpipelined["ok"] and summed["ok"], (unpipelined, summed)


TTGIR = """\
    %ring = ttg.local_alloc : () -> !ttg.memdesc<2x16x32xf32, #shared, #smem, mutable>
    %s0 = ttg.memdesc_index %ring[%c0] : !ttg.memdesc<2x16x32xf32> -> !ttg.memdesc<16x32xf32>
    %p0 = ttg.async_copy_global_to_local %ptrs0, %s0 mask %m0 : tensor<16x32x!tt.ptr<f32>> -> <16x32xf32>
    %s1 = ttg.memdesc_index %ring[%c1] : !ttg.memdesc<2x16x32xf32> -> !ttg.memdesc<16x32xf32>
    %p1 = ttg.async_copy_global_to_local %ptrs1, %s1 mask %m1 : tensor<16x32x!tt.ptr<f32>> -> <16x32xf32>
    %r:3 = scf.for %i = %c0 to %c4 step %c1 iter_args(%acc = %cst) -> (tensor<16x64xf32>) : i32 {
      %tok = ttg.async_wait %t {num = 2 : i32}
      %now = ttg.memdesc_index %ring[%slot] : !ttg.memdesc<2x16x32xf32> -> !ttg.memdesc<16x32xf32>
      %x = ttg.local_load %now token %tok : !ttg.memdesc<16x32xf32> -> tensor<16x32xf32>
      %next = ttg.memdesc_index %ring[%slot2] : !ttg.memdesc<2x16x32xf32> -> !ttg.memdesc<16x32xf32>
      %cp = ttg.async_copy_global_to_local %ptrs, %next mask %m : tensor<16x32x!tt.ptr<f32>> -> <16x32xf32>
      %y = scf.if %flag -> (tensor<16x64xf32>) {
        %x2 = ttg.local_load %now token %tok : !ttg.memdesc<16x32xf32> -> tensor<16x32xf32>
        scf.yield %z : tensor<16x64xf32>
      } else {
        scf.yield %acc : tensor<16x64xf32>
      }
      scf.yield %y : tensor<16x64xf32>
    } loc(#loc1)
    %after = ttg.local_load %now token %tok : !ttg.memdesc<16x32xf32> -> tensor<16x32xf32>
"""


def test_the_scan_finds_the_read_after_the_refill_only():
    """Two copies run ahead into a ring of two buffers, so the in-loop copy refills the buffer its
    iteration reads: the read inside the branch (line 13) follows it; the stage's first read (line
    9) precedes it, and the read after the loop is outside its body. A ring of three buffers (an
    extra one, as triton-lang/triton#8139's fix gives such loads) or a copy into another ring is
    no race."""
    found = stale_reads(TTGIR)
    assert len(found) == 1 and found[0].startswith("line 13: %x2 = ttg.local_load %now token"), found
    assert stale_reads(TTGIR.replace("memdesc<2x16x32xf32, #shared, #smem, mutable>",
                                     "memdesc<3x16x32xf32, #shared, #smem, mutable>")) == []
    assert stale_reads(TTGIR.replace("%ring[%slot2]", "%other[%slot2]")) == []


def test_every_config_of_an_autotuned_kernel_is_recorded_and_scanned():
    """benchmarks/pipeline_races.py on an upstream-style kernel: each autotune config is recorded
    (the GPU's autotuner may pick any) and compiled through the wrapper; only the pipelined one races."""
    from benchmarks.pipeline_races import every_config
    from tests.gpu_compile import distinct, recording_launches
    from tests.racing_kernels import autotuned_branch_after_product
    a, b, out = torch.zeros(16 * 128), torch.zeros(128 * 64), torch.zeros(16 * 64)
    with recording_launches() as records, every_config():
        autotuned_branch_after_product[(1,)](a, b, out, torch.ones(1, dtype=torch.int32), K=128, BK=32, REREAD=True)
    records = distinct(records)
    assert [r["options"]["num_stages"] for r in records] == [1, 3], records
    unpipelined, pipelined = compile_records(records)
    assert unpipelined["ok"] and not pipelined["ok"] and pipelined["error"].startswith("PipelineRace"), \
        (unpipelined, pipelined)
