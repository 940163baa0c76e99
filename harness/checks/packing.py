"""packing: a packed case run again as its sequences one by one (each its own call, B = 1, its own
initial state), against the packed run. Both are compared with the same golden (the references
run sequence by sequence); this check says whether the packed path computes what the plain path
computes, within the sum of the two runs' bounds, as the variants' agreement rows do."""
from harness.checks.check import Check
from harness.execution import describe_error
from harness.packing import per_sequence


def rows(ctx, impl, execution) -> list[dict]:
    try:
        plain = ctx.run(impl, wrap=lambda fn: per_sequence(fn, ctx.spec)).result
    except Exception as exc:
        return [ctx.row(impl, "packing", "", verdict="ERROR",
                        message=f"the sequences run one by one: {describe_error(exc)}")]
    out_rows = []
    for name in ctx.names:
        metrics = ctx.agreement(name, ctx.against_golden(execution.result, name),
                                ctx.against_golden(plain, name), execution.result, plain)
        if metrics.get("message"):
            metrics["message"] = f"packed against one by one: {metrics['message']}"
        out_rows.append(ctx.row(impl, "packing", name, **metrics))
    return out_rows


CHECK = Check("packing", rows, applies=lambda ctx, impl: ctx.case.packed)
