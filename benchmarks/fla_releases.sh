#!/usr/bin/env bash
# `--impl fla` against several upstream releases: each release installed into its own folder, one
# (release, op) a job, the jobs run in lanes over the GPUs (gpu_lanes.sh); each row names its
# release (benchmarks/fla_findings.md has the results).
#   bash benchmarks/fla_releases.sh OUT_DIR RELEASE...
# A RELEASE is one wheel, or a release's wheels joined by commas: fla-core's (the kernels) first,
# then flash-linear-attention's (the layers), whose fla/ is merged into the first's without
# replacing its files. Releases before fla-core shipped the kernels in flash-linear-attention,
# whose fla/__init__.py imports its layers and so transformers: DEPS, a folder of wheels (the
# transformers such a release was made for), goes on PYTHONPATH after the release. OPS, DTYPES
# (comma-separated), TS, GPUS (indices, default every GPU), LANES (jobs at once per GPU, default
# 1), LIMIT (seconds for the whole run, default 500) and AUTOTUNE (the sweeps' --autotune,
# default upstream) choose the grid, the machine and how fla's autotuners run; a job
# whose folder holds rows from an earlier run resumes it (else starts it afresh). TUNED, a
# folder of fla's autotune results kept between runs (fla_autotune.sh), spares the releases'
# first calls minutes of autotuning.
set -u
out=${1:?output folder}; shift
mkdir -p "$out"
. "$(dirname "$0")/fla_autotune.sh"
. "$(dirname "$0")/gpu_lanes.sh"
restore_autotune "${TUNED:-}"
deps=""
if [ -n "${DEPS:-}" ]; then
    deps=/tmp/fla-release-deps
    python -m pip install -q --no-index --no-deps --no-compile --target "$deps" "$DEPS"/*.whl || exit 1
fi
jobs=()
for release in "$@"; do
    name=$(basename "${release%%,*}" | cut -d- -f1-2)
    site=/tmp/fla-release-$name
    for wheel in ${release//,/ }; do
        python -m pip install -q --no-index --no-deps --no-compile --target "$site.part" "$wheel" || continue 2
        mkdir -p "$site" && cp -rn "$site.part/." "$site/" && rm -rf "$site.part"
    done
    mkdir -p "$out/$name"
    for op in ${OPS:-linear_attn simple_gla gla rwkv6 gsa delta_rule gated_delta_rule kda}; do
        dir="$out/$name/$op"
        jobs+=("PYTHONPATH=$site${deps:+:$deps}:${PYTHONPATH:-} timeout -k 30 -s INT \$LEFT \
            python -m harness sweep --op $op --impl fla --dtype ${DTYPES:-fp32,bf16} --T ${TS:-1,65,1000} \
            --H 2 --K 64 --V 64 --M 64 --autotune ${AUTOTUNE:-upstream} --quiet --out $dir \$(run_folder_flag $dir) >> $dir.log 2>&1
            echo \"$name $op: exit \$?\"")
    done
done
run_lanes "${LIMIT:-500}" "${jobs[@]}" | tee -a "$out/releases.log"
keep_autotune "${TUNED:-}" | tee -a "$out/releases.log"
