"""inputs: every input, initial state and upstream gradient is bitwise the same after forward and
backward; a kernel that writes into one fails, naming it."""
from harness.checks.check import Check
from harness.checks.bits import bitwise_equal, describe_difference


def rows(ctx, impl, execution) -> list[dict]:
    for name, (got, original) in execution.given.items():
        if not bitwise_equal(got, original):
            return [ctx.row(impl, "inputs", name, verdict="FAIL",
                            message=f"the kernel wrote into its input {name} "
                                    f"({describe_difference(got, original)} changed)")]
    return [ctx.row(impl, "inputs", "", verdict="PASS", message="")]


CHECK = Check("inputs", rows)
