"""A large unpacked call runs over groups of batch entries (ops/common/batch_groups.py) so that its
backward's float32 partials fit: the groups give the whole call's results bit for bit, forward
and backward (the fused_recurrent Functions, with rwkv6's and kda's the widest, and gla's
fused_chunk), with the initial state cut and rwkv6's shared bonus u not (its gradient, a sum over
every entry, is added group by group: equal to rounding, not to the bit)."""
import fla_kernels  # noqa: F401  (sets the interpreter up before triton is imported)
import pytest
import torch

import fla_kernels.ops.common.batch_groups as batch_groups
from fla_kernels import fused_chunk_gla, fused_recurrent_kda, fused_recurrent_rwkv6
from harness.registry import get_op
from tests.kernel_testing import assert_identical, make_inputs, run


def test_groups_cover_the_batch_within_the_budget(monkeypatch):
    monkeypatch.setattr(batch_groups, "PARTS_BUDGET", 100)
    assert batch_groups.batch_groups(5, 40) == [(0, 2), (2, 4), (4, 5)]
    assert batch_groups.batch_groups(3, 1000) == [(0, 1), (1, 2), (2, 3)], "one entry a group at least"
    assert batch_groups.batch_groups(4, 25) == [(0, 4)]


@pytest.mark.parametrize("op, fn", [("rwkv6", fused_recurrent_rwkv6), ("gla", fused_chunk_gla),
                                   ("kda", fused_recurrent_kda)],
                         ids=["fused_recurrent_rwkv6", "fused_chunk_gla", "fused_recurrent_kda"])
def test_batch_groups_give_the_whole_calls_bits(monkeypatch, op, fn):
    x = make_inputs(get_op(op), 3, 20, 2, 16, 16, torch.float32, h0=True, seed=3)
    whole = run(fn, x)
    calls = []
    real = batch_groups.batch_groups
    monkeypatch.setattr(batch_groups, "batch_groups", lambda B, per_row: calls.append(B) or real(B, 10 ** 18))
    monkeypatch.setattr(batch_groups, "PARTS_BUDGET", 1)
    grouped = run(fn, x)
    assert calls, "the call never asked for batch groups"
    shared = {"du"}
    assert_identical({n: t for n, t in whole.items() if n not in shared},
                     {n: t for n, t in grouped.items() if n not in shared})
    for name in shared & whole.keys():
        torch.testing.assert_close(grouped[name], whole[name], rtol=1e-6, atol=1e-6)
