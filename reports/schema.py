"""Every CSV the harness writes, in one place: its columns and their types.

results.csv (a sweep: one row per case, implementation and tensor or check), the baselines (a
subset of its columns), bench.csv (one row per timing) and kernels.csv (one row per kernel of a
timed pass). The harness writes them and `reports` reads them; both take the columns from here,
so neither imports the other for them.
"""

SHAPE = ("B", "T", "H", "K", "V", "M")   # the shape symbols of a case, in the order of the columns
RUN_COLUMNS = ("run_id", "device", "torch", "triton", "git")  # per-run metadata, usually constant

# ----------------------------------------------------------------------------- results.csv
COLUMNS = [
    "run_id", "case_id", "op", "variant", "impl", "dtype", *SHAPE,
    "h0", "gate", "seed", "varlen", "option", "check", "tensor",
    "err", "rel", "rms_rel", "base_err", "floor", "spread", "atol", "bound", "ratio",
    "nan", "inf", "first_bad", "verdict", "message",
    "device", "torch", "triton", "git", "wall_s", "case_rows",
]
INT_COLUMNS = (*SHAPE, "seed", "nan", "inf")
FLOAT_COLUMNS = ("err", "rel", "rms_rel", "base_err", "floor", "spread", "atol", "bound", "ratio",
                 "wall_s")
# `spread` (aggregate rows): the root sum of squares of the kernel's deviations from the golden
# rounded to its dtype over the summed elements, the largest over the sums. Errors of random sign
# sum to at most CHANCE_SIGMAS spreads (Hoeffding: 2 exp(-CHANCE_SIGMAS^2 / 2)); a sum further
# off leans one way. A kernel that rounds in another order draws its sums afresh within that.
CHANCE_SIGMAS = 4.0

# `check` values: "golden" compares a tensor with the float64 reference; "aggregate" compares a
# gradient's sums over tokens (tensor "dw (sum over t)") and over batch, tokens and heads with the
# golden's, so that errors of one sign show; "agreement" compares one variant with another of the
# same op (impl names both, e.g. "chunk~fused_recurrent"); "run" is the row of a case that raised
# (ERROR; its tensor names what the implementation returned wrong, when that is the reason) or was
# skipped (SKIP). "inputs" fails when the implementation wrote into an input (tensor names it);
# "determinism" when a second identical run differs bitwise (tensor names the first that did);
# "segments" compares each tensor of a run split into segments along T, chaining the final
# states, with the golden; "packing" a packed case's run with its sequences run one by one;
# "inference" the forward run under torch.no_grad (o and final states) with the golden;
# "options" and "layer": README. `varlen` and `option` say how the case calls the op (packed
# sequences, an option of the op); "none" for its core call on a plain batch.
CHECKS = ("golden", "aggregate", "agreement", "run", "inputs", "determinism", "segments", "packing",
          "inference", "options", "layer")
VERDICTS = ("PASS", "FAIL", "ERROR", "SKIP")
# The "options" rows name their tensor "<tensor> (<option>)"; this option runs the case with its
# final state returned but left out of the loss (reports/patterns.py reads it back).
FINAL_STATE_UNUSED = "final state not in the loss"
# `case_rows`: how many rows the case wrote, on each of them. A case whose rows in a results file
# number fewer (a sweep killed while writing it) is incomplete, and `--resume` runs it again.

# ----------------------------------------------------------------------------- baselines
# Columns a baseline keeps: the row's identity, its numbers and verdict, and where it was made.
# The floor (the golden's rounding in the tensor's dtype), atol and a sum's spread make the gate's
# noise model.
BASELINE_COLUMNS = ["run_id", "case_id", "op", "variant", "impl", "dtype", *SHAPE,
                    "h0", "gate", "seed", "varlen", "option", "check", "tensor", "err", "floor", "spread", "atol", "bound",
                    "ratio", "verdict", "device", "torch", "triton", "git"]

# ----------------------------------------------------------------------------- bench.csv
BENCH_COLUMNS = ("run_id", "op", "impl", "variant", "dtype", *SHAPE,
                 "phase", "median_ms", "q25_ms", "q75_ms", "tflops", "gbps", "message",
                 "device", "torch", "triton", "git")
BENCH_INT_COLUMNS = SHAPE
BENCH_FLOAT_COLUMNS = ("median_ms", "q25_ms", "q75_ms", "tflops", "gbps")

# ----------------------------------------------------------------------------- kernels.csv
KERNEL_COLUMNS = ("run_id", "op", "impl", "variant", "dtype", *SHAPE, "kernel", "calls", "ms", "share")
