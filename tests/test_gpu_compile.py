"""Every kernel specialisation our public functions launch compiles for Hopper (sm_90).

Runs without a GPU: launches are recorded under the interpreter with GPU numerics selected, then
compiled by Triton's real compiler. It catches what the interpreter lets through (loop-carried
values that change shape, mismatched broadcasts, dot operand dtypes) before a GPU run does.
"""
import pytest
import torch

from fla_kernels import chunk_rwkv6, fused_recurrent_rwkv6
from tests.gpu_compile import compile_records, distinct, recording_launches

# K != V and a non-power-of-two head dim; bf16 (tensor-core dots) and fp32 (IEEE dots) code paths.
SHAPES = [(64, 16), (60, 60)]
DTYPES = [torch.bfloat16, torch.float32]


def _forward_backward(fn, dtype, K, V, with_h0):
    B, T, H = 1, 70, 2
    r, k, w = (torch.randn(B, T, H, K, dtype=dtype, requires_grad=True) for _ in range(3))
    v = torch.randn(B, T, H, V, dtype=dtype, requires_grad=True)
    u = torch.randn(H, K, dtype=dtype, requires_grad=True)
    h0 = torch.randn(B, H, K, V, requires_grad=True) if with_h0 else None
    o, ht = fn(r, k, v, w, u, initial_state=h0, output_final_state=True)
    torch.autograd.backward([o, ht], [torch.randn_like(o), torch.randn_like(ht)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel tests compile every kernel")
@pytest.mark.parametrize("fn", [chunk_rwkv6, fused_recurrent_rwkv6], ids=lambda f: f.__name__)
def test_every_launched_kernel_compiles_for_sm90(fn):
    with recording_launches() as records:
        for dtype in DTYPES:
            for K, V in SHAPES:
                for with_h0 in (False, True):
                    _forward_backward(fn, dtype, K, V, with_h0)
    records = distinct(records)
    assert len({r["name"] for r in records}) >= 3, "no kernel launch was recorded"
    failures = [r for r in compile_records(records) if not r["ok"]]
    assert not failures, "\n\n".join(f"{f['name']} {f['constexprs']}:\n{f['error']}" for f in failures)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs the interpreter to record launches")
def test_the_check_rejects_a_kernel_only_the_compiler_refuses():
    from tests import broken_triton
    with recording_launches() as records:
        broken_triton.launch(torch.zeros(16, 16), torch.zeros(16))
    (result,) = compile_records(distinct(records))
    assert not result["ok"] and "Loop-carried variable acc" in result["error"]
