"""`python -m harness`: see harness.cli."""
import sys

import fla_kernels  # noqa: F401  (sets the Triton interpreter up before any kernel is defined)
from harness.cli import main

sys.exit(main())
