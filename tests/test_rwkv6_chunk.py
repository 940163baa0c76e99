"""What only chunk_rwkv6 is tested for: its gate gradient summed over tokens, and the backward taking
the forward's scores. Its cases against the float64 reference and the checks every kernel keeps are
in tests/test_kernels.py.

Runs on CPU through the Triton interpreter (set by `import fla_kernels` when CUDA is absent), so
shapes stay small. Inputs, runner and reference come from tests/kernel_testing.py.
"""
from __future__ import annotations

import functools

import torch

from fla_kernels.ops.rwkv6.chunk import chunk_rwkv6
from references.rwkv6 import rwkv6_chunked
from tests.kernel_testing import DEVICE, RWKV6, emulated, make_inputs, reference, run


def test_gate_gradient_summed_over_tokens_is_as_accurate_as_the_baseline():
    """What a layer's decay bias sees: sum_t dw_t * w_t (w = -exp(bias + ...)). Elementwise dw can
    pass while its errors share a sign over a chunk; on the H100's bf16 tensor cores the q dq - k dk
    sums once left a residue 20 times the baseline's (T=65). Under the interpreter products are
    fp32 and this only checks the sums; on a GPU it is the regression test."""
    B, T, K = (2, 1000, 64) if DEVICE == "cuda" else (1, 130, 16)
    x = make_inputs(RWKV6, B, T, 1, K, K, torch.bfloat16, h0=False)
    w = x.args(torch.float64)[3]
    exact = reference(RWKV6, x, False)["dw"]
    baseline = functools.partial(rwkv6_chunked, chunk_size=64, operand_dtype=torch.bfloat16)

    def summed_error(fn):
        return ((run(fn, x, False)["dw"].double() - exact) * w).sum(dim=1).abs().max().item()

    assert summed_error(chunk_rwkv6) <= 2 * summed_error(baseline) + 1e-3


def test_backward_with_the_forward_scores_equals_recomputing_them():
    """The backward takes the intra-chunk scores A from the forward; recomputed, they give the
    same gradients bit for bit (the wrappers pass A along; this pins that it is the same A)."""
    from fla_kernels.ops.common.chunk_gated import chunk_gated_bwd, chunk_gated_fwd
    x = make_inputs(RWKV6, 1, 70, 2, 16, 24, torch.float32, gate="strong")
    r, k, v, w, u = x.args()
    h0 = x.initial_state()
    _, _, A = chunk_gated_fwd(r, k, v, w, u, 0.3, h0, reads_previous=True)
    common = (r, k, v, w, u, 0.3, h0, x.do, x.dht[0])
    kept = chunk_gated_bwd(*common, reads_previous=True, A=A)
    again = chunk_gated_bwd(*common, reads_previous=True)
    for name, a, b in zip(["dr", "dk", "dv", "dw", "du", "dh0"], kept, again):
        assert torch.equal(a, b), name


def test_the_bonus_reaches_o_and_dv_unrounded():
    """bf16 with the tensor cores' operand rounding (a GPU's, or emulated): the bonus
    sum_d q_d u_d k_d once sat on A's diagonal, rounded to bf16 before o = A v, and a decode step
    (T = 1, all of o the bonus) came out at 1.1 times its bound on the H100 (K = V = 8, packed).
    Taken in fp32, o is its golden's one rounding and dv within its bound's half."""
    rows = emulated("case", "rwkv6", "chunk", "bf16", "2", "1", "4", "8", "8", "strong", "packed",
                    "none", "none")
    verdict, err, bound, floor = rows["golden: o"]
    assert verdict == "PASS" and err <= 1.01 * floor, rows["golden: o"]
    verdict, err, bound, _ = rows["golden: dv"]
    assert verdict == "PASS" and err <= 0.5 * bound, rows["golden: dv"]
