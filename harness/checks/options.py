"""options: each optional-argument combination (no final state, a final state left out of the loss,
an initial state without gradient) and each option of the op (an optional input passed as None,
linear attention's normalize, simple GLA's g_gamma: `OpSpec.all_options`) against its own golden.
It exercises argument handling, not numerics: once per (op, dtype, initial-state option, packing)
of a plan, on cases short enough for the float64 loop (`loop_max_T`), as each combination is a
golden of its own. An implementation that does not take an option gets a SKIP row saying so."""
from dataclasses import replace

from harness.checks.check import Check
from harness.execution import describe_error, rejected_or_error, unsupported
from reports.schema import FINAL_STATE_UNUSED


def option_settings(spec, case) -> list[tuple[str, dict]]:
    """(label, run_implementation options) of the optional-argument combinations beyond the case's:
    no final state, a final state left out of the loss, and the initial state given without
    gradient (when the case's has one)."""
    settings = [("no final state", {"final_state": "off"}),
                (FINAL_STATE_UNUSED, {"final_state": "unused"})]
    if case.h0 == "grad":
        settings.append(("initial state without gradient", {"h0_grad": False}))
    return settings


def _compare(ctx, impl, label, references, run) -> list[dict]:
    """The rows of one combination: `references()` gives its golden and baseline, `run()` the
    implementation's results. Tensors it has no golden for (the final state when it is not
    returned, the gradient of an input passed as None) are skipped."""
    try:
        golden_pair = references()
    except Exception as exc:
        return [ctx.row(impl, "options", "", verdict="ERROR",
                        message=f"with {label}: golden or baseline failed: {describe_error(exc)}")]
    try:
        out = run()
    except Exception as exc:
        verdict, message = rejected_or_error(exc, ctx.case)
        return [ctx.row(impl, "options", "", verdict=verdict, message=f"with {label}: {message}")]
    rows = []
    for name in ctx.names:
        if golden_pair[0].get(name) is None:
            continue
        metrics = ctx.against_golden(out, name, golden_pair)
        if metrics.get("message"):
            metrics["message"] = f"with {label}: {metrics['message']}"
        rows.append(ctx.row(impl, "options", f"{name} ({label})", **metrics))
    return rows


def rows(ctx, impl, execution) -> list[dict]:
    out_rows = []
    for label, options in option_settings(ctx.spec, ctx.case):
        out_rows += _compare(ctx, impl, label, lambda: ctx.references_for(label, options),
                             lambda: ctx.run(impl, **options).result)
    for option in ctx.spec.all_options():
        if option == ctx.case.option:
            continue
        other = replace(ctx.case, option=option)
        reason = unsupported(impl.fn, ctx.spec, other)
        if reason:
            out_rows.append(ctx.row(impl, "options", "", verdict="SKIP", message=f"with {option}: {reason}"))
            continue
        try:
            derived = ctx.derive(other)
        except Exception as exc:
            out_rows.append(ctx.row(impl, "options", "", verdict="ERROR",
                                    message=f"with {option}: golden or baseline failed: {describe_error(exc)}"))
            continue
        out_rows += [{**row, "case_id": ctx.case.case_id, "option": ctx.case.option}
                     for row in _compare(derived, impl, option, lambda: (derived.golden, derived.baseline),
                                         lambda: derived.run(impl).result)]
    return out_rows


CHECK = Check("options", rows, group=("op", "dtype", "h0", "varlen"),
              applies=lambda ctx, impl: ctx.case.T <= ctx.spec.loop_max_T)
