"""The long-form result schema: one row per (case, implementation, tensor or check)."""

COLUMNS = [
    "run_id", "case_id", "op", "variant", "impl", "dtype", "B", "T", "H", "K", "V", "M",
    "h0", "gate", "seed", "check", "tensor",
    "err", "rel", "rms_rel", "base_err", "floor", "atol", "bound", "ratio",
    "nan", "inf", "first_bad", "verdict", "message",
    "device", "torch", "triton", "git", "wall_s", "case_rows",
]

# `check` values: "golden" compares a tensor with the float64 reference; "aggregate" compares a
# gradient's sums over tokens (tensor "dw (sum over t)") and over batch, tokens and heads with the
# golden's, so that errors of one sign show; "agreement" compares one variant with another of the
# same op (impl names both, e.g. "chunk~fused_recurrent"); "run" is the row of a case that raised
# (ERROR; its tensor names what the implementation returned wrong, when that is the reason) or was
# skipped (SKIP). "inputs" fails when the implementation wrote into an input (tensor names it);
# "determinism" when a second identical run differs bitwise (tensor names the first that did);
# "segments" compares each tensor of a run split into segments along T, chaining the final
# states, with the golden; "options" and "layer": README.
CHECKS = ("golden", "aggregate", "agreement", "run", "inputs", "determinism", "segments", "options",
          "layer")
VERDICTS = ("PASS", "FAIL", "ERROR", "SKIP")
# The "options" rows name their tensor "<tensor> (<option>)"; this option runs the case with its
# final state returned but left out of the loss (reports/patterns.py reads it back).
FINAL_STATE_UNUSED = "final state not in the loss"
# `case_rows`: how many rows the case wrote, on each of them. A case whose rows in a results file
# number fewer (a sweep killed while writing it) is incomplete, and `--resume` runs it again.
