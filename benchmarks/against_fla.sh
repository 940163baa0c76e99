#!/usr/bin/env bash
# Ours against upstream fla on the H100 target shape (B=8, T=2048, H=16, K=V=128, bf16), one bench
# run per op so that ours and fla's are timed side by side, then fla's variants through the sweep.
#   bash benchmarks/against_fla.sh OUT_DIR [fla-core wheel]
# fla's first calls compile and autotune for minutes (chunk_rwkv6: 85 s forward, 119 s backward on
# a cold cache), so each op gets its own time limit ($LIMIT seconds, default 900).
set -u
out=${1:?output folder}
wheel=${2:-}
mkdir -p "$out"
if [ -n "$wheel" ]; then
    python -m pip install -q --no-deps --no-index "$wheel"
fi
for op in ${OPS:-gla rwkv6 simple_gla linear_attn gsa}; do
    start=$SECONDS
    timeout "${LIMIT:-900}" python -m harness bench --op "$op" --kernels --out "$out/bench_$op" > "$out/bench_$op.log" 2>&1
    echo "bench $op: exit $?, $((SECONDS - start)) s" | tee -a "$out/bench.log"
done
# fla's variants through the sweep, one process per op and dtype at once: its autotuning is
# compilation, bound by one CPU core per process (benchmarks/fla_findings.md has the last results)
for op in ${OPS:-gla rwkv6 simple_gla linear_attn gsa}; do
    for dtype in ${DTYPES:-bf16 fp16 fp32}; do
        (timeout "${LIMIT:-900}" python -m harness sweep --op "$op" --impl fla --dtype "$dtype" \
            --T 63,1000,4096 --H 2 --K 64 --V 64 --quiet --out "$out/fla_${op}_$dtype" \
            > "$out/fla_${op}_$dtype.log" 2>&1
         echo "fla sweep $op $dtype: exit $?" | tee -a "$out/bench.log") &
    done
done
wait
