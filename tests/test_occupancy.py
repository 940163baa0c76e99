"""Programs an SM holds and waves (benchmarks/occupancy.py), and the programs each recorded launch
runs (tests/gpu_compile.py), which `benchmarks.kernel_resources` reports together."""
import pytest
import torch

from benchmarks.occupancy import programs_per_sm, waves
from harness.cases import Case
from harness.execution import execute
from harness.inputs import make_inputs
from harness.registry import OPS
from tests.gpu_compile import _programs, distinct, recording_launches


@pytest.mark.parametrize("registers,warps,shared,held,limit", [
    # Nsight Compute on the H200 (benchmarks/tuning.md, fifteenth lease): the delta rule's backward
    # walk and its output gradients' kernel, two programs an SM
    (255, 4, 94260, 2, "registers+shared memory"),
    (247, 4, 24576, 2, "registers"),
    # registers go by 8 a thread (41 takes 48: 5 programs, not the 6 that 41 would allow)
    (41, 8, 0, 5, "registers"),
    # each program also takes 1 KiB of shared memory (113.5 KiB: one program, not two)
    (64, 4, 116224, 1, "shared memory"),
    (24, 16, 0, 4, "warps"),
    (32, 1, 0, 32, "programs"),
])
def test_programs_an_sm_holds_are_what_hopper_allocates(registers, warps, shared, held, limit):
    assert programs_per_sm(registers, warps, shared) == (held, limit)


def test_waves_are_a_launchs_programs_over_what_the_sms_hold():
    assert waves(512, 2) == pytest.approx(1.94, abs=0.005)   # ncu's figure for the walks above
    assert waves(264, 2) == 1.0


def test_a_launch_runs_the_product_of_its_grid_in_programs():
    def kernel(x, n, BLOCK):
        pass
    assert _programs((12, 3), kernel, (None, 7), {"BLOCK": 4}) == 36
    assert _programs(lambda meta: (meta["n"] // meta["BLOCK"], 2), kernel, (None, 8), {"BLOCK": 4}) == 4


def test_distinct_specialisations_keep_their_largest_launch():
    a = {"name": "k", "signature": {"x": "*fp32"}, "programs": 8}
    records = distinct([a, {**a, "programs": 20}, {**a, "name": "j", "programs": 3}, {**a, "programs": 5}])
    assert [(r["name"], r["programs"]) for r in records] == [("k", 20), ("j", 3)]


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="launches are recorded through the interpreter (tests/gpu_compile.py)")
def test_recorded_launches_count_the_chunked_delta_rules_programs():
    """B = 2, T = 130 (3 chunks of 64), H = 3, K = V = 64, bf16: the walks run a program per
    64-wide V-block and (batch, head), the per-chunk kernels one per chunk and (batch, head)."""
    spec = OPS["delta_rule"]
    case = Case(op="delta_rule", dtype="bf16", B=2, T=130, H=3, K=64, V=64, h0="grad", gate="normal", seed=0)
    with recording_launches() as records:
        execute(spec.variant_fn("chunk"), spec, case, make_inputs(spec, case, torch.device("cpu")))
    programs = {r["name"]: r["programs"] for r in distinct(records)}
    assert programs["_fwd_walk_kernel"] == programs["_bwd_walk_kernel"] == 6
    assert programs["_prepare_kernel"] == programs["_bwd_wy_kernel"] == programs["_bwd_output_kernel"] == 3 * 6
