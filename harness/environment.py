"""Where a run happens: device, library versions, git commit, run id."""
from __future__ import annotations

import datetime
import os
import platform
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


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _blas() -> str:
    """The BLAS libraries loaded (numpy's, which the Triton interpreter's products go through, and
    torch's), with the kernel set each picked for this CPU and their threads."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown (threadpoolctl is not installed)"
    import numpy  # noqa: F401  (loads numpy's BLAS, so that it is listed)
    parts = [f"{i['internal_api']} {i.get('version') or ''} {i.get('architecture') or ''} "
             f"{i['num_threads']} threads".replace("  ", " ")
             for i in threadpool_info() if i["user_api"] == "blas"]
    mkl = torch.backends.mkl.is_available()
    return "; ".join(parts + (["torch: MKL"] if mkl else [])) or "unknown"


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"


def machine() -> dict:
    """What a run's numbers can depend on beyond the code: CPU, BLAS, GPU, driver, CUDA, torch,
    triton (a baseline records it; the gate shows it beside the candidate's)."""
    info = {"cpu": _cpu_model(), "blas": _blas(), "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        info.update(gpu=torch.cuda.get_device_name(), driver=_driver(), cuda=torch.version.cuda or "")
    else:
        info.update(gpu="none (triton interpreter)", cpu_capability=torch.backends.cpu.get_cpu_capability())
    return info


def new_run_id(label: str) -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + f"-{label}"
