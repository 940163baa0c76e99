#!/usr/bin/env bash
# The GPU preset of one op in every dtype, the dtypes side by side on one GPU (a benchmark run).
#   OP=rwkv6 DTYPES="bf16 fp16 fp32" bash benchmarks/gpu_sweep.sh OUT_DIR [extra sweep flags]
# Writes OUT_DIR/<dtype>/results.csv and OUT_DIR/<dtype>.log (terminal summary and wall time).
set -u
out=${1:?output folder}
shift
mkdir -p "$out"
for dtype in ${DTYPES:-bf16 fp16 fp32}; do
    (
        start=$SECONDS
        python -m harness sweep --op "${OP:-rwkv6}" --dtype "$dtype" --out "$out/$dtype" --quiet "$@" \
            > "$out/$dtype.log" 2>&1
        code=$?
        echo "exit $code, process wall $((SECONDS - start)) s" >> "$out/$dtype.log"
    ) &
done
wait
