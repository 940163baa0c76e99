"""Run a repro script (`harness repro`'s) with every Triton autotuner on its first config that fits
(`harness.autotune_mode`), as a `--autotune first` sweep ran its case: seconds where upstream's
first calls autotune for minutes.
    python -m benchmarks.first_config_run SCRIPT [ARGS...]"""
import runpy
import sys

from harness import autotune_mode


def main(argv: list[str]) -> None:
    autotune_mode.first_config_only()
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
