"""What only GSA's kernels are tested for: a loss on one of the two final states, and chunk_gsa's
scratch buffers. Their cases against the float64 reference and the checks every kernel keeps are in
tests/test_kernels.py.

CPU: Triton interpreter. Inputs, runner and assertions come from tests/kernel_testing.py, with the
GSA declaration, whose state is the pair (hk [B, H, K, M], hv [B, H, M, V]).
"""
import pytest
import torch

from fla_kernels.ops.gsa import chunk_gsa, fused_recurrent_gsa
from harness.registry import get_op
from references.gsa import gsa_recurrent
from tests.kernel_testing import REL_TOL, assert_close, make_inputs, run

GSA = get_op("gsa")
IMPLS = [fused_recurrent_gsa, chunk_gsa]
name_of = {fused_recurrent_gsa: "fused_recurrent", chunk_gsa: "chunk"}


def _ids(p):
    return name_of.get(p, str(p).replace("torch.", ""))


@pytest.mark.parametrize("fn", IMPLS, ids=_ids)
def test_gradient_from_one_final_state_only(fn):
    """The loss uses o and hv but not hk: autograd hands the backward no gradient for hk."""
    x = make_inputs(GSA, 1, 20, 1, 16, 8, torch.float32, "normal", True, seed=5, M=16)
    outs = []
    for f in (fn, gsa_recurrent):
        dt = torch.float64 if f is gsa_recurrent else torch.float32
        leaves = [t.detach().to(dt).requires_grad_() for t in x.args()]
        h0 = tuple(t.detach().to(dt).requires_grad_() for t in x.h0)
        o, (hk, hv) = f(*leaves, initial_state=h0, output_final_state=True)
        torch.autograd.backward([o, hv], [x.do.to(dt), x.dht[1].to(dt)])
        outs.append([t.grad for t in leaves + list(h0)])
    for name, got, ref in zip(["dq", "dk", "dv", "ds", "dg", "dhk0", "dhv0"], *outs):
        assert_close(name, got, ref, REL_TOL[torch.float32])


@pytest.mark.parametrize("T", [37, 65])
def test_chunk_reads_no_scratch_it_did_not_write(monkeypatch, T):
    """Every buffer chunk_gsa's launchers take from torch.empty / empty_like starts as NaN (the
    weights C, whose columns after a row's sub-chunk are never written, the scores, the paths into
    the leaving state, ...): o, the final states and every gradient stay the same to the bit."""
    x = make_inputs(GSA, 1, T, 2, 16, 8, torch.float32, "normal", True, seed=7, M=16)
    clean = run(chunk_gsa, x, True)
    empty, empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    monkeypatch.setattr(torch, "empty_like",
                        lambda *a, **kw: empty_like(*a, **kw).fill_(float("nan")))
    poisoned = run(chunk_gsa, x, True)
    for name, t in clean.items():
        assert torch.equal(poisoned[name], t), f"{name} changed when the scratch started as NaN"
