# Sourced by the fla scripts here: fla's first calls autotune for minutes on an empty Triton
# cache, so a folder of its autotune results (Triton's *.autotune.json) from an earlier run is
# copied into the cache first and the cache's results back into it at the end; fla's kernels then
# compile once instead of timing every config. Only autotuners made with `cache_results` write
# such a result; TRITON_CACHE_AUTOTUNING=1 has every one write it, so the releases whose kernels
# predate that argument are spared the minutes too.
#   restore_autotune DIR     (DIR empty or missing: nothing)
#   keep_autotune DIR        (prints how many results DIR holds)
triton_cache=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
export TRITON_CACHE_AUTOTUNING=1

restore_autotune() {
    mkdir -p "$triton_cache"
    [ -n "${1:-}" ] && [ -d "$1" ] && cp -rn "$1/." "$triton_cache/"
    return 0
}

keep_autotune() {
    [ -n "${1:-}" ] || return 0
    mkdir -p "$1"
    (cd "$triton_cache" && find . -name '*.autotune.json' -print0 | tar --null -cf - -T -) | tar -xf - -C "$1"
    echo "autotune results kept: $(find "$1" -name '*.autotune.json' | wc -l)"
}
