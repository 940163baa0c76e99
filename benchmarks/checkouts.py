"""Another checkout of the project beside this one, for the A/B tools (ab_bench, ab_bits): a process
that imports its code, and a copy of this one's code to test them with."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent   # this checkout
CODE = ("fla_kernels", "harness", "references", "reports")   # what a run of the harness imports


def env_for(tree) -> dict:
    """This process's environment with tree's code first on the path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.abspath(tree), os.environ.get("PYTHONPATH", "")])}


def copy_code(dest: Path) -> Path:
    """This checkout's code copied into dest (a base tree that is this one), dest returned."""
    for name in CODE:
        shutil.copytree(HERE / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest
