"""Every kernel specialisation our public functions launch compiles for Hopper (sm_90).

Runs without a GPU: each registered op and variant goes through the harness's forward and backward
with launches recorded under the interpreter (GPU numerics selected), then Triton's real compiler
builds every distinct specialisation. It catches what the interpreter lets through (loop-carried
values that change shape, mismatched broadcasts, dot operand dtypes) before a GPU run does.
"""
import pytest
import torch

from harness.cases import Case
from harness.inputs import make_inputs
from harness.registry import OPS
from harness.checks.inference import without_grad
from harness.execution import execute
from tests.gpu_compile import compile_records, distinct, recording_launches

# (dtype, K, V, initial state) compiled for every op: K != V, a head dim that is not a power of
# two, several V-blocks with masked edges (where the pipeliner multiplies shared-memory buffers),
# an initial state; bf16, the tensor-core dots (where Triton's miscompiles have been). fp32 (IEEE
# dots, operands twice as wide in shared memory) is not compiled here: the delta rule's chunked
# kernels, whose fp32 tiles come nearest the H100's limit, take 90-100 s each to compile for it on
# CI's CPUs, and compile for real in fp32 in the H100 gate and sweeps (kda at K = 256 included),
# as every dtype does. The compile test is most of CI's time on a cold Triton cache, so it takes
# what fails on CPU only this way. One block's specialisations are left to
# the packed test (K = 64, V = 16).
COMPILED = [("bf16", 128, 100, "grad")]
# Variants whose kernels are another compiled variant's with other constexpr flags (no gate, a
# scalar gate, the bonus term) are left to the H100, to keep CI's cold compile under its limit.
SAME_KERNELS = {("delta_rule", "chunk"), ("delta_rule", "fused_recurrent"),
                ("gated_delta_rule", "fused_recurrent"), ("linear_attn", "fused_recurrent"),
                ("simple_gla", "fused_recurrent"), ("rwkv6", "chunk")}
VARIANTS = [(op, variant) for op, spec in sorted(OPS.items()) for variant in spec.variants
            if (op, variant) not in SAME_KERNELS]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="on a GPU the kernel tests compile every kernel for real")


@pytest.mark.parametrize("op,variant", VARIANTS, ids=[f"{o}-{v}" for o, v in VARIANTS])
def test_every_launched_kernel_compiles_for_sm90(op, variant):
    spec = OPS[op]
    fn = spec.variant_fn(variant)
    with recording_launches() as records:
        for dtype, K, V, h0 in COMPILED:
            case = Case(op=op, dtype=dtype, B=1, T=70, H=2, K=K, V=V, h0=h0, gate="normal",
                        seed=0, **{s: 32 for s in spec.symbols})
            inputs = make_inputs(spec, case, torch.device("cpu"))
            execute(fn, spec, case, inputs)
            # and as the inference check runs it: a forward may launch other kernels without autograd
            execute(without_grad(fn), spec, case, inputs, requires_grad=(), h0_grad=False, o_in_loss=False,
                    final_state="unused")
    records = distinct(records)
    assert len({r["name"] for r in records}) >= 3, "fewer than 3 kernels' launches were recorded (forward, backward)"
    failures = [r for r in compile_records(records) if not r["ok"]]
    assert not failures, "\n\n".join(f"{f['name']} {f['constexprs']}:\n{f['error']}" for f in failures)


def test_simple_gla_without_a_gate_compiles_for_sm90():
    """g=None takes other specialisations (no gate) than the registry's cases."""
    from fla_kernels.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
    with recording_launches() as records:
        for fn in (chunk_simple_gla, fused_recurrent_simple_gla):
            q, k = (torch.randn(1, 70, 2, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
            v = torch.randn(1, 70, 2, 16, dtype=torch.bfloat16, requires_grad=True)
            o, ht = fn(q, k, v, None, output_final_state=True)
            torch.autograd.backward([o, ht], [torch.randn_like(o), torch.randn_like(ht)])
    failures = [r for r in compile_records(distinct(records)) if not r["ok"]]
    assert not failures, "\n\n".join(f"{f['name']}:\n{f['error']}" for f in failures)


@pytest.mark.parametrize("op", ["gated_delta_rule", "kda"])
def test_delta_chunk_kernels_fit_the_h100_at_the_widest_key_head(op):
    """The delta ops take K up to WIDEST_KEY_HEAD (ops/common/chunk_delta.py), on the promise that
    their chunk kernels fit the H100's shared memory there: a scalar gate's kernels and kda's
    per-channel ones at K = V = that width compile for sm_90 within the limit, forward and
    backward."""
    from fla_kernels.ops.common.chunk_delta import WIDEST_KEY_HEAD
    spec = OPS[op]
    with recording_launches() as records:
        case = Case(op=op, dtype="bf16", B=1, T=70, H=1, K=WIDEST_KEY_HEAD, V=WIDEST_KEY_HEAD,
                    h0="grad", gate="normal", seed=0)
        execute(spec.variant_fn("chunk"), spec, case, make_inputs(spec, case, torch.device("cpu")))
    records = distinct(records)
    per_channel = "pairs_kernel" in {r["name"] for r in records}
    assert per_channel == (op == "kda"), "a scalar gate took the per-channel kernels, or kda did not"
    failures = [r for r in compile_records(records) if not r["ok"]]
    assert not failures, "\n\n".join(f"{f['name']} {f['constexprs']}:\n{f['error']}" for f in failures)


def test_packed_batches_compile_for_sm90():
    """A packed batch (cu_seqlens) takes its own specialisations of the state walks (VARLEN),
    with its initial states and final states' gradients."""
    cu_seqlens = torch.tensor([0, 1, 24, 94, 96])
    N = cu_seqlens.numel() - 1
    with recording_launches() as records:
        for op in ("linear_attn", "simple_gla", "gla", "rwkv6", "gsa", "gated_delta_rule"):
            spec = OPS[op]
            for variant in ("chunk", "fused_recurrent"):
                for dtype in ("bf16",):   # VARLEN walks: the same code in fp32
                    case = Case(op=op, dtype=dtype, B=1, T=96, H=2, K=64, V=16, h0="none",
                                gate="normal", seed=0, **{s: 32 for s in spec.symbols})
                    dims = {**case.dims(), "B": N}
                    inputs = [x.requires_grad_() for x in make_inputs(spec, case, "cpu").tensors.values()]
                    h0 = [torch.zeros([dims[d] for d in s.shape], requires_grad=True) for s in spec.states]
                    o, finals = spec.variant_fn(variant)(*inputs, initial_state=h0[0] if len(h0) == 1 else h0,
                                                         output_final_state=True, cu_seqlens=cu_seqlens)
                    finals = [finals] if len(h0) == 1 else list(finals)
                    torch.autograd.backward([o, *finals], [torch.ones_like(x) for x in (o, *finals)])
    packed = [r for r in distinct(records) if r["constexprs"].get("VARLEN")]
    assert {r["name"] for r in packed} >= {"_chunk_fwd_h_kernel", "_chunk_bwd_dh_kernel", "_fwd_kernel",
                                           "_bwd_dq_kernel", "_bwd_dkv_kernel", "_bwd_fwd_kernel",
                                           "_bwd_rev_kernel", "_fwd_walk_kernel", "_bwd_walk_kernel"}
    failures = [r for r in compile_records(packed) if not r["ok"]]
    assert not failures, "\n\n".join(f"{f['name']} {f['constexprs']}:\n{f['error']}" for f in failures)


def test_the_check_rejects_a_kernel_only_the_compiler_refuses():
    from tests import broken_triton
    with recording_launches() as records:
        broken_triton.launch(torch.zeros(16, 16), torch.zeros(16))
    (result,) = compile_records(distinct(records))
    assert not result["ok"] and "Loop-carried variable acc" in result["error"]


def test_the_check_rejects_a_kernel_over_the_shared_memory_limit():
    from tests import broken_triton
    with recording_launches() as records:
        broken_triton.launch_oversized(*(torch.zeros(256, 256) for _ in range(3)))
    (result,) = compile_records(distinct(records))
    assert not result["ok"] and "OutOfResources" in result["error"] and "shared memory" in result["error"]


def test_launches_compile_as_the_launcher_specialises_them(tmp_path):
    """The records carry what Triton's launcher would specialise (tests/specialised_triton.py), and the
    compiler sees it: without divisibility 16 on aligned pointers no load vectorises, and ptxas's
    registers, spills and shared memory were those of another program than the GPU runs."""
    from tests import specialised_triton
    data = torch.zeros(80)
    with recording_launches() as records:
        specialised_triton.launch(data[:64], data[4:68], 32, 1, 32)    # y 16-byte aligned
        specialised_triton.launch(data[:64], data[1:65], 33, 2, 16)    # y 4 bytes off, n not / 16
    aligned, offset = records
    assert aligned["attrs"] == {"x": "D", "y": "D", "n": "D"}
    assert aligned["signature"]["one"] == "constexpr" and aligned["constexprs"]["one"] == 1
    assert aligned["signature"]["n_plain"] == "i32" and "n_plain" not in aligned["attrs"]
    assert offset["attrs"] == {"x": "D"} and offset["signature"]["one"] == "i32"
    results = compile_records([aligned, offset], asm_dir=str(tmp_path))
    assert all(r["ok"] for r in results), results
    ttgir = [(tmp_path / f"scaled_copy_kernel-{i}.ttgir").read_text() for i in range(2)]
    signature = [text[text.index("tt.func"):].split("\n")[0] for text in ttgir]
    assert signature[0].count("tt.divisibility = 16") == 3, signature[0]
    assert signature[1].count("tt.divisibility = 16") == 1, signature[1]
