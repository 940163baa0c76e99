#!/usr/bin/env bash
# Shards of a GPU preset in one run folder, carried from one device call to the next (a benchmark run).
#   HARNESS_GIT_COMMIT=abc1234 OPS=delta_rule,gated_delta_rule,kda \
#       bash benchmarks/preset_shards.sh SHARDS SECONDS JOBS [extra sweep flags]
# e.g. SHARDS 6-12/12: runs `sweep --preset gpu --dtype fp32,fp16,bf16 --shard SHARDS --jobs JOBS`
# for at most SECONDS (then SIGINT: the sweep keeps every finished row), resuming the run folder
# unpacked from $CARRIED (default .gpu/runs.tgz) where an earlier call brought one back.
# Writes under $OUT: runs.tgz (the run folder without its HTML), sweep.log and dmon.log
# (`nvidia-smi dmon` every 5 s: memory held and kernel activity).
set -u
shards=${1:?shards, e.g. 6-12/12}
seconds=${2:?seconds to run}
jobs=${3:?workers}
shift 3
: "${HARNESS_GIT_COMMIT:?set it to the commit under test: the tree copied to the device has no current .git}"
export HARNESS_GIT_COMMIT
out=${OUT:?the folder that comes back}
runs=/tmp/runs
run="$runs/r${shards//\//of}"
carried=${CARRIED:-.gpu/runs.tgz}
mkdir -p "$runs"
[ -f "$carried" ] && tar xzf "$carried" -C "$runs"
resume=()
[ -f "$run/results.csv" ] && resume=(--resume)
nvidia-smi dmon -d 5 -s um > "$out/dmon.log" 2>&1 &
dmon=$!
start=$SECONDS
timeout -s INT "$seconds" python -m harness sweep --op "${OPS:-delta_rule,gated_delta_rule,kda}" \
    --preset gpu --dtype fp32,fp16,bf16 --shard "$shards" --jobs "$jobs" --out "$run" "${resume[@]}" \
    --quiet "$@" > "$out/sweep.log" 2>&1
echo "exit $?, wall $((SECONDS - start)) s" >> "$out/sweep.log"
kill "$dmon"
tar czf "$out/runs.tgz" --exclude=report.html -C "$runs" .
