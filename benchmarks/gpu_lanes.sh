# Sourced by the fla scripts here: their jobs dealt over the GPUs in lanes, LANES per GPU (default
# 1), each lane running its jobs one after another until the run's time is spent. fla's first calls
# compile and time every autotune config on the GPU; many of them at once on a GPU finish nothing
# (2 x H200, 32 processes of release and op at once: 2 of them finished a case in 460 s; the same
# host, one process per GPU: gla and gsa at a new head dim, two cases each in 352 and 443 s;
# benchmarks/fla_findings.md).
#   run_lanes LIMIT JOB...
# LIMIT: seconds for the whole run. Each JOB is a bash command line, run with CUDA_VISIBLE_DEVICES
# set to its lane's GPU and LEFT to its share of the time: what the run has left over the jobs its
# lane has still to run (at least a minute), so that a job that ends early leaves its time to the
# next. A job with under a minute of the run left is not started, and says so on stdout. GPUS
# (indices) picks the GPUs. SHARE=rest gives each job all the time the run has left instead: for
# jobs that each need minutes of fla's autotuning before their first row, where even shares end
# every job inside its autotuning (2 x H100, 14 jobs of gla and gsa at new head dims, 300 s: none
# finished a case), so that the first jobs finish and the rest wait for the next run.
run_lanes() {
    local limit=$1; shift
    local jobs=("$@") start=$SECONDS
    local gpus=(${GPUS:-$(seq 0 $(( $(nvidia-smi -L | wc -l) - 1 )))})
    local lanes=$(( ${#gpus[@]} * ${LANES:-1} ))
    local lane
    for ((lane = 0; lane < lanes; lane++)); do
        (for ((j = lane; j < ${#jobs[@]}; j += lanes)); do
            left=$(( limit - (SECONDS - start) ))
            if [ "$left" -lt 60 ]; then
                echo "not started, ${left} s left: ${jobs[j]}"
                continue
            fi
            share=$left
            [ "${SHARE:-even}" = rest ] || share=$(( left / ((${#jobs[@]} - j + lanes - 1) / lanes) ))
            share=$(( share < 60 ? 60 : share ))
            CUDA_VISIBLE_DEVICES=${gpus[$((lane % ${#gpus[@]}))]} LEFT=$share bash -c "${jobs[j]}"
        done) &
    done
    wait
}


# A sweep job's run-folder flag: --resume where its folder holds rows of an earlier run, else
# --force (a folder left with a plan and no rows starts afresh). Exported for the jobs' shells.
run_folder_flag() {
    if [ -f "$1/results.csv" ]; then echo --resume; else echo --force; fi
}
export -f run_folder_flag
