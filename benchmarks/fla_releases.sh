#!/usr/bin/env bash
# `--impl fla` against several upstream releases: each release's wheel installed into its own
# folder, one (release, op) per process, the processes dealt over the visible GPUs; each row names
# its release (benchmarks/fla_findings.md has the results).
#   bash benchmarks/fla_releases.sh OUT_DIR WHEEL...
# A wheel is fla-core's or flash-linear-attention's (releases before fla-core shipped the kernels
# in flash-linear-attention, whose fla/__init__.py imports its layers and so transformers: put what
# a release imports on PYTHONPATH first). OPS, DTYPES (comma-separated), TS and LIMIT (seconds per
# process, default 500) choose the grid.
set -u
out=${1:?output folder}; shift
mkdir -p "$out"
gpus=$(nvidia-smi -L | wc -l)
i=0
for wheel in "$@"; do
    name=$(basename "$wheel" | cut -d- -f1-2)
    site=/tmp/fla-release-$name
    python -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel" || continue
    mkdir -p "$out/$name"
    for op in ${OPS:-linear_attn simple_gla gla rwkv6 gsa delta_rule gated_delta_rule kda}; do
        (PYTHONPATH="$site:${PYTHONPATH:-}" CUDA_VISIBLE_DEVICES=$((i % gpus)) \
            timeout -k 30 -s INT "${LIMIT:-500}" python -m harness sweep --op "$op" --impl fla \
            --dtype "${DTYPES:-fp32,bf16}" --T "${TS:-1,65,1000}" --H 2 --K 64 --V 64 --M 64 --quiet \
            --out "$out/$name/$op" > "$out/$name/$op.log" 2>&1
         echo "$name $op: exit $?" | tee -a "$out/releases.log") &
        i=$((i + 1))
    done
done
wait
