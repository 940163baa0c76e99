"""options: each optional-argument combination (no final state, a final state left out of the loss,
an initial state without gradient, an optional input passed as None) against its own golden.
It exercises argument handling, not numerics: once per (op, dtype, initial-state option) of a
plan, on cases short enough for the float64 loop (`loop_max_T`), as each combination is a golden
of its own."""
from harness.checks.check import Check
from harness.execution import describe_error
from reports.schema import FINAL_STATE_UNUSED


def option_settings(spec, case) -> list[tuple[str, dict]]:
    """(label, run_implementation options) of the optional-argument combinations beyond the case's:
    no final state, a final state left out of the loss, the initial state given without gradient
    (when the case's has one), and each optional input passed as None."""
    settings = [("no final state", {"final_state": "off"}),
                (FINAL_STATE_UNUSED, {"final_state": "unused"})]
    if case.h0 == "grad":
        settings.append(("initial state without gradient", {"h0_grad": False}))
    return settings + [(f"{s.name}=None", {"without": (s.name,)}) for s in spec.inputs if s.optional]



def rows(ctx, impl, execution) -> list[dict]:
    """Tensors a combination has no golden for (the final state when it is not returned, the
    gradient of an input passed as None) are skipped."""
    out_rows = []
    for label, options in option_settings(ctx.spec, ctx.case):
        try:
            references = ctx.references_for(label, options)
        except Exception as exc:
            out_rows.append(ctx.row(impl, "options", "", verdict="ERROR",
                                    message=f"with {label}: golden or baseline failed: {describe_error(exc)}"))
            continue
        try:
            out = ctx.run(impl, **options).result
        except Exception as exc:
            out_rows.append(ctx.row(impl, "options", "", verdict="ERROR",
                                    message=f"with {label}: {describe_error(exc)}"))
            continue
        for name in ctx.names:
            if references[0].get(name) is None:
                continue
            metrics = ctx.against_golden(out, name, references)
            if metrics.get("message"):
                metrics["message"] = f"with {label}: {metrics['message']}"
            out_rows.append(ctx.row(impl, "options", f"{name} ({label})", **metrics))
    return out_rows


CHECK = Check("options", rows, group=("op", "dtype", "h0"),
              applies=lambda ctx, impl: ctx.case.T <= ctx.spec.loop_max_T)
