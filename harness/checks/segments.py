"""segments: T split in two, the second segment starting from the first's final state and the
gradient flowing back through it; every tensor against the golden, bounded by the baseline
chained through the same segments (its rounding differs from one call's: a final chunk of 44
tokens instead of 1 moves fp16's ht error 40-fold). Not on packed cases (their sequences are
calls of their own), nor under an option whose calls do not chain (gsa's g=None restarts its
normaliser with each call)."""
from harness.checks.check import Check
from harness.execution import describe_error


def segment_bounds(T: int) -> list[tuple[int, int]]:
    """Two segments cut at T // 3, which for most T falls inside a chunk of 16 and of 64 tokens:
    the first returns a final state, the second starts from it, and the gradient flows back
    through it. (One cut covers both sides; more cuts would only cost more runs.)"""
    if T < 2:
        return []
    cut = max(1, T // 3)
    return [(0, cut), (cut, T)]


def rows(ctx, impl, execution) -> list[dict]:
    segments = segment_bounds(ctx.case.T)
    if not segments:
        return []
    where = "over segments " + " ".join(f"[{a},{b})" for a, b in segments)
    try:
        references = ctx.references_for("segments", {"segments": segments},
                                        golden=ctx.references_for("one call", {})[0])
    except Exception as exc:
        return [ctx.row(impl, "segments", "", verdict="ERROR",
                        message=f"{where}: baseline failed: {describe_error(exc)}")]
    try:
        out = ctx.run(impl, segments=segments).result
    except Exception as exc:
        return [ctx.row(impl, "segments", "", verdict="ERROR", message=f"{where}: {describe_error(exc)}")]
    out_rows = []
    for name in ctx.names:
        metrics = ctx.against_golden(out, name, references)
        if metrics.get("message"):
            metrics["message"] = f"{where}: {metrics['message']}"
        out_rows.append(ctx.row(impl, "segments", name, **metrics))
    return out_rows


CHECK = Check("segments", rows, applies=lambda ctx, impl: not ctx.case.packed
              and ctx.spec.option_spec().chainable)
