#!/usr/bin/env bash
# `--impl fla` against several upstream releases: each release installed into its own folder, one
# (release, op) per process, the processes dealt over the GPUs; each row names its release
# (benchmarks/fla_findings.md has the results).
#   bash benchmarks/fla_releases.sh OUT_DIR RELEASE...
# A RELEASE is one wheel, or a release's wheels joined by commas: fla-core's (the kernels) first,
# then flash-linear-attention's (the layers), whose fla/ is merged into the first's without
# replacing its files. Releases before fla-core shipped the kernels in flash-linear-attention,
# whose fla/__init__.py imports its layers and so transformers: DEPS, a folder of wheels (the
# transformers such a release was made for), goes on PYTHONPATH after the release. OPS, DTYPES
# (comma-separated), TS, GPUS (indices, default every GPU) and LIMIT (seconds per process,
# default 500) choose the grid and the machine; TUNED, a folder of fla's autotune results kept
# between runs (fla_autotune.sh), spares the releases' first calls minutes of autotuning.
set -u
out=${1:?output folder}; shift
mkdir -p "$out"
. "$(dirname "$0")/fla_autotune.sh"
restore_autotune "${TUNED:-}"
gpus=(${GPUS:-$(seq 0 $(( $(nvidia-smi -L | wc -l) - 1 )))})
deps=""
if [ -n "${DEPS:-}" ]; then
    deps=/tmp/fla-release-deps
    python -m pip install -q --no-index --no-deps --no-compile --target "$deps" "$DEPS"/*.whl || exit 1
fi
i=0
for release in "$@"; do
    name=$(basename "${release%%,*}" | cut -d- -f1-2)
    site=/tmp/fla-release-$name
    for wheel in ${release//,/ }; do
        python -m pip install -q --no-index --no-deps --no-compile --target "$site.part" "$wheel" || continue 2
        mkdir -p "$site" && cp -rn "$site.part/." "$site/" && rm -rf "$site.part"
    done
    mkdir -p "$out/$name"
    for op in ${OPS:-linear_attn simple_gla gla rwkv6 gsa delta_rule gated_delta_rule kda}; do
        (PYTHONPATH="$site${deps:+:$deps}:${PYTHONPATH:-}" CUDA_VISIBLE_DEVICES=${gpus[$((i % ${#gpus[@]}))]} \
            timeout -k 30 -s INT "${LIMIT:-500}" python -m harness sweep --op "$op" --impl fla \
            --dtype "${DTYPES:-fp32,bf16}" --T "${TS:-1,65,1000}" --H 2 --K 64 --V 64 --M 64 --quiet \
            --out "$out/$name/$op" > "$out/$name/$op.log" 2>&1
         echo "$name $op: exit $?" | tee -a "$out/releases.log") &
        i=$((i + 1))
    done
done
wait
keep_autotune "${TUNED:-}" | tee -a "$out/releases.log"
