"""causality: o before a token must not change when the inputs at and after it do. The forward
runs twice under torch.no_grad, on the case's inputs and on inputs whose tokens from P = T // 3
on are replaced by earlier tokens' (valid draws of every input's own distribution, reversed);
o[:, :P] must be bitwise the same. A kernel that anchors a chunk's exponentials on a later row
(upstream KDA's safe_gate path, fla-org/flash-linear-attention#1240) or reads past its mask
passes the golden at rounding level and fails here. A difference is checked against two more
unchanged runs first: a forward that is not deterministic cannot tell (the determinism check
says why)."""
import torch

from harness.checks.bits import bitwise_equal, describe_difference
from harness.checks.check import Check
from harness.checks.inference import forward_without_grad
from harness.execution import describe_error


def cut(T: int) -> int:
    """P: the first token replaced. T // 3 falls inside a chunk of 16 and of 64 for most T."""
    return max(1, T // 3)


def later_tokens_replaced(x: torch.Tensor, P: int) -> torch.Tensor:
    """x with tokens P.. (axis 1) replaced by tokens P - 1, P - 2, ... (cycling through 0..P-1)."""
    T = x.shape[1]
    source = (P - 1 - torch.arange(T - P)) % P
    return torch.cat([x[:, :P], x[:, source.to(x.device)]], dim=1)


def replacing_later_tokens(names, sequence, P):
    """wrap(fn) for CaseContext.run: fn called with its sequence inputs' tokens P.. replaced."""
    def wrap(fn):
        def call(*args, **kwargs):
            args = [later_tokens_replaced(x, P) if name in sequence and x is not None else x
                    for name, x in zip(names, args)]
            return fn(*args, **kwargs)
        return call
    return wrap


def _forward(ctx, impl, wrap=None):
    return forward_without_grad(ctx, impl, wrap)["o"]


def rows(ctx, impl, execution) -> list[dict]:
    P = cut(ctx.inputs.dims["T"])   # a packed case's: all its sequences, one after another
    sequence = ctx.spec.under(ctx.case.option).sequence_inputs()
    where = f"tokens {P}.. replaced"
    try:
        same = _forward(ctx, impl)
        changed = _forward(ctx, impl, replacing_later_tokens(list(ctx.inputs.tensors), sequence, P))
    except Exception as exc:
        return [ctx.row(impl, "causality", "o", verdict="ERROR",
                        message=f"{where}: {describe_error(exc)}")]
    before, after = same[:, :P], changed[:, :P]
    if bitwise_equal(before, after):
        return [ctx.row(impl, "causality", "o", verdict="PASS", message="")]
    difference = describe_difference(before, after)
    try:
        again = [_forward(ctx, impl)[:, :P] for _ in range(2)]
    except Exception as exc:
        return [ctx.row(impl, "causality", "o", verdict="ERROR",
                        message=f"{where}, run again: {describe_error(exc)}")]
    other = next((x for x in again if not bitwise_equal(before, x)), None)
    if other is not None:
        return [ctx.row(impl, "causality", "o", verdict="SKIP",
                        message=f"cannot tell: two unchanged forwards differ before token {P} "
                                f"({describe_difference(before, other)})")]
    return [ctx.row(impl, "causality", "o", verdict="FAIL",
                    message=f"o before token {P} changed when the inputs from token {P} on did: {difference}")]


CHECK = Check("causality", rows, group=("op", "dtype", "T", "varlen", "option"), forward_only=True,
              applies=lambda ctx, impl: ctx.case.T >= 2)
