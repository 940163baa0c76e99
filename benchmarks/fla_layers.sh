#!/usr/bin/env bash
# Upstream fla's own layers through the layer check, one op per process, the processes dealt over
# the visible GPUs (benchmarks/fla_findings.md has the results and the wheels the layers need).
#   bash benchmarks/fla_layers.sh OUT_DIR CORE_WHEEL LAYER_WHEELS_DIR [AUTOTUNE_DIR]
# CORE_WHEEL: fla-core's; LAYER_WHEELS_DIR: flash-linear-attention's and its needs (transformers...).
# flash-linear-attention's wheel has no fla/__init__.py, so fla-core's fla/ is copied over its own.
# AUTOTUNE_DIR: fla's autotune results from an earlier lease (fla_autotune.sh). Each process
# gets $LIMIT seconds (default 500).
set -u
out=${1:?output folder}; core=${2:?fla-core wheel}; layers=${3:?layer wheels folder}; tuned=${4:-}
site=${SITE:-/tmp/fla-layers}
mkdir -p "$out" "$site"
python -m pip install -q --no-index --no-deps --no-compile --target "$site" "$layers"/*.whl || exit 1
python -m pip install -q --no-index --no-deps --no-compile --target "$site/core" "$core" || exit 1
cp -rn "$site/core/fla/." "$site/fla/"
export PYTHONPATH="$site:${PYTHONPATH:-}"
. "$(dirname "$0")/fla_autotune.sh"
restore_autotune "$tuned"
gpus=$(nvidia-smi -L | wc -l)
i=0
for op in ${OPS:-gla gsa rwkv6 delta_rule gated_delta_rule kda linear_attn}; do
    (CUDA_VISIBLE_DEVICES=$((i % gpus)) timeout -k 30 -s INT "${LIMIT:-500}" python -m harness sweep \
        --op "$op" --impl fla --dtype "${DTYPES:-bf16}" --B 2 --T 100 --H 2 --K 64 --V 64 --M 64 \
        --h0 none --gate normal --variant "${VARIANT:-chunk}" --checks layer --quiet \
        --out "$out/$op" > "$out/$op.log" 2>&1
     echo "fla layer $op: exit $?" | tee -a "$out/layers.log") &
    i=$((i + 1))
done
wait
keep_autotune "$tuned" | tee -a "$out/layers.log"
