"""The long-form result schema: one row per (case, implementation, tensor or check)."""

COLUMNS = [
    "run_id", "case_id", "op", "variant", "impl", "dtype", "B", "T", "H", "K", "V", "M",
    "h0", "gate", "seed", "check", "tensor",
    "err", "rel", "rms_rel", "base_err", "floor", "atol", "bound", "ratio",
    "nan", "inf", "first_bad", "verdict", "message",
    "device", "torch", "triton", "git", "wall_s",
]

# `check` values: "golden" compares a tensor with the float64 reference; "agreement" compares one
# variant with another of the same op (impl names both, e.g. "chunk~fused_recurrent"); "run" is the
# row of a case that raised (ERROR) or was skipped (SKIP), with an empty tensor. "inputs" fails when
# the implementation wrote into an input (tensor names it); "determinism" when a second identical run
# differs bitwise (tensor names the first that did); "segments" compares each tensor of a run split
# into segments along T, chaining the final states, with the golden.
CHECKS = ("golden", "agreement", "run", "inputs", "determinism", "segments")
VERDICTS = ("PASS", "FAIL", "ERROR", "SKIP")
# The "options" rows name their tensor "<tensor> (<option>)"; this option runs the case with its
# final state returned but left out of the loss (reports/patterns.py reads it back).
FINAL_STATE_UNUSED = "final state not in the loss"
