#!/usr/bin/env bash
# Upstream fla's own layers through the layer check, one op a job, the jobs run in lanes over the
# GPUs (gpu_lanes.sh; benchmarks/fla_findings.md has the results and the wheels the layers need).
#   bash benchmarks/fla_layers.sh OUT_DIR CORE_WHEEL LAYER_WHEELS_DIR [AUTOTUNE_DIR]
# CORE_WHEEL: fla-core's; LAYER_WHEELS_DIR: flash-linear-attention's and its needs (transformers...).
# flash-linear-attention's wheel has no fla/__init__.py, so fla-core's fla/ is copied over its own.
# AUTOTUNE_DIR: fla's autotune results from an earlier lease (fla_autotune.sh). LIMIT: seconds for
# the whole run (default 500); AUTOTUNE: the sweeps' --autotune (default upstream; first spares
# a cold cache the timing of every config). A job whose folder holds rows from an earlier run
# resumes it (else starts it afresh).
set -u
out=${1:?output folder}; core=${2:?fla-core wheel}; layers=${3:?layer wheels folder}; tuned=${4:-}
site=${SITE:-/tmp/fla-layers}
mkdir -p "$out" "$site"
python -m pip install -q --no-index --no-deps --no-compile --target "$site" "$layers"/*.whl || exit 1
python -m pip install -q --no-index --no-deps --no-compile --target "$site/core" "$core" || exit 1
cp -rn "$site/core/fla/." "$site/fla/"
export PYTHONPATH="$site:${PYTHONPATH:-}"
. "$(dirname "$0")/fla_autotune.sh"
. "$(dirname "$0")/gpu_lanes.sh"
restore_autotune "$tuned"
jobs=()
for op in ${OPS:-gla gsa rwkv6 delta_rule gated_delta_rule kda linear_attn}; do
    jobs+=("timeout -k 30 -s INT \$LEFT python -m harness sweep --op $op --impl fla --dtype ${DTYPES:-bf16} \
        --B 2 --T 100 --H 2 --K 64 --V 64 --M 64 --h0 none --gate normal --variant ${VARIANT:-chunk} \
        --checks layer --autotune ${AUTOTUNE:-upstream} --quiet --out $out/$op \$(run_folder_flag $out/$op) >> $out/$op.log 2>&1
        echo \"fla layer $op: exit \$?\"")
done
run_lanes "${LIMIT:-500}" "${jobs[@]}" | tee -a "$out/layers.log"
keep_autotune "$tuned" | tee -a "$out/layers.log"
