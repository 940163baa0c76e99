"""`python -m harness`: see harness.cli. A sweep runs in a worker process under a supervisor
(harness.supervisor), so that a process that dies in a case costs only that case. Guarded: a
sweep's GPU workers (harness.parallel) start by importing this module under another name."""
import os
import sys

from harness.supervisor import WORKER, interrupt_once_per_press, supervise, supervised

if __name__ == "__main__":
    if supervised(sys.argv[1:]):
        sys.exit(supervise(sys.argv[1:]))
    if os.environ.get(WORKER):
        interrupt_once_per_press()

    try:
        import fla_kernels  # noqa: F401  (sets the Triton interpreter up before any kernel is defined)
        from harness.cli import main
    except KeyboardInterrupt:   # Ctrl-C (or timeout -s INT) while torch and triton load
        print("harness: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(main())
