"""inference: the forward as a model's generation runs it, under torch.no_grad with no input
requiring a gradient. A kernel may take another path there (ours fuse kda's output into the state
walk and store no states for a backward), so its outputs and final states are checked against
the golden again, with the forward's bounds."""
import torch

from harness.checks.check import Check
from harness.execution import describe_error


def without_grad(fn):
    """fn called under torch.no_grad."""
    def call(*args, **kwargs):
        with torch.no_grad():
            return fn(*args, **kwargs)
    return call


def forward_without_grad(ctx, impl, wrap=None) -> dict:
    """The results of one forward of impl's function (or of `wrap(function)`) under
    torch.no_grad, no input requiring a gradient, the final states returned and in no loss."""
    def inner(fn):
        return without_grad(wrap(fn) if wrap else fn)
    return ctx.run(impl, wrap=inner, requires_grad=(), h0_grad=False, o_in_loss=False,
                   final_state="unused").result


def forward_names(ctx) -> list:
    """The tensors of the case a forward alone returns: o and the final states."""
    returned = ["o", *ctx.spec.final_state_names()]
    return [name for name in ctx.names if name in returned]


def rows(ctx, impl, execution) -> list[dict]:
    try:
        out = forward_without_grad(ctx, impl)
    except Exception as exc:
        return [ctx.row(impl, "inference", "", verdict="ERROR",
                        message=f"under no_grad: {describe_error(exc)}")]
    out_rows = []
    for name in forward_names(ctx):
        metrics = ctx.against_golden(out, name)
        if metrics.get("message"):
            metrics["message"] = f"under no_grad: {metrics['message']}"
        out_rows.append(ctx.row(impl, "inference", name, **metrics))
    return out_rows


CHECK = Check("inference", rows, group=("op", "dtype", "T"))
