"""determinism: the case run again must give bitwise the same outputs and gradients; the row names
the first tensor that differed and by how much."""
from fla_kernels.utils import interpreting
from harness.checks.check import Check
from harness.checks.bits import bitwise_equal, describe_difference
from harness.execution import describe_error


def can_race(impl) -> bool:
    """Whether running `impl` twice can show a difference: not for our Triton kernels under the
    interpreter, which runs every program serially; for every other implementation, yes."""
    return not (impl.impl == "ours" and interpreting())


def rows(ctx, impl, execution) -> list[dict]:
    try:
        second = ctx.run(impl).result
    except Exception as exc:
        return [ctx.row(impl, "determinism", "", verdict="ERROR",
                        message=f"the second identical run raised: {describe_error(exc)}")]
    for name in ctx.names:
        a, b = execution.result.get(name), second.get(name)
        if (a is None) != (b is None) or (a is not None and not bitwise_equal(a, b)):
            detail = "present in one run only" if a is None or b is None else describe_difference(a, b)
            return [ctx.row(impl, "determinism", name, verdict="FAIL",
                            message=f"{name} differs between two identical runs: {detail}")]
    return [ctx.row(impl, "determinism", "", verdict="PASS", message="")]


CHECK = Check("determinism", rows, applies=lambda ctx, impl: can_race(impl))
