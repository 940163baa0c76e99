"""Where a run happens: device, library versions, git commit, run id."""
from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path

import torch
import triton


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "cpu (triton interpreter)"


def git_commit() -> str:
    """The checkout's short commit (with -dirty), or $HARNESS_GIT_COMMIT where there is no .git
    (a copy of the tree on a GPU box), else "unknown"."""
    if os.environ.get("HARNESS_GIT_COMMIT"):
        return os.environ["HARNESS_GIT_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if out.returncode != 0:
        return "unknown"
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def run_fields() -> dict:
    """The columns every row of one run shares."""
    return {"device": device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "git": git_commit()}


def new_run_id(label: str) -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + f"-{label}"
