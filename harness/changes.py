"""Which ops a change touches: the gate sweeps only those.

A file under an op's kernel folder selects that op; a layer file selects the op it wraps. Anything
the numbers of every op depend on (the harness, the references, the tolerance table, shared kernel
code, the package set-up) selects every op. Files that cannot change a number (documentation,
tests, benchmarks, report rendering, CI files) select none. A path no rule knows selects every op:
the gate errs towards running too much, never too little.
"""
from __future__ import annotations

import fnmatch
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.registry import OPS

LAYER_OPS = {"linear_attention.py": "linear_attn", "gated_linear_attention.py": "gla",
             "gated_slot_attention.py": "gsa", "rwkv6_attention.py": "rwkv6"}

# (glob, why) for files that select nothing, checked after the rules that select ops
NO_NUMBERS = [
    ("*.md", "documentation"), ("docs/*", "documentation"), ("tests/*", "tests"),
    ("benchmarks/*", "benchmarks"), ("reports/*", "report rendering"), (".github/*", "CI"),
    (".ci/*", "CI"), ("baselines/*", "baselines"), ("LICENSE*", "licence"), (".gitignore", "git"),
]


@dataclass(frozen=True)
class Selection:
    ops: tuple            # selected op names, in registry order
    reasons: dict         # op -> the first changed file that selected it and why

    def describe(self) -> str:
        if not self.ops:
            return "no changed file can change a kernel's numbers"
        by_reason = {}
        for op in self.ops:
            by_reason.setdefault(self.reasons[op], []).append(op)
        return "; ".join(f"{', '.join(ops)}: {why}" for why, ops in by_reason.items())


def ops_for_path(path: str) -> tuple[list[str], str]:
    """(ops a change to `path` selects, why), path relative to the repository root."""
    parts = Path(path).parts
    if len(parts) >= 3 and parts[:2] == ("fla_kernels", "ops") and parts[2] in OPS:
        return [parts[2]], f"its kernels changed ({path})"
    if len(parts) >= 3 and parts[:2] == ("fla_kernels", "layers") and parts[2] in LAYER_OPS:
        return [LAYER_OPS[parts[2]]], f"its layer changed ({path})"
    if parts[:1] in (("harness",), ("references",)):
        what = "the tolerance table" if path.endswith("tolerance.py") else f"the {parts[0]}"
        return list(OPS), f"{what} changed ({path})"
    if parts[:1] == ("fla_kernels",):
        return list(OPS), f"shared kernel code changed ({path})"
    for pattern, why in NO_NUMBERS:
        if fnmatch.fnmatch(path, pattern):
            return [], why
    if path in ("pyproject.toml", "tox.ini", "setup.py", "setup.cfg"):
        return list(OPS), f"the package set-up changed ({path})"
    return list(OPS), f"a file no rule knows changed ({path})"


def select_ops(paths) -> Selection:
    reasons = {}
    for path in paths:
        ops, why = ops_for_path(path)
        for op in ops:
            reasons.setdefault(op, why)
    return Selection(tuple(op for op in OPS if op in reasons), reasons)


def changed_files(base: str, repo: Path | None = None) -> list[str]:
    """Files that differ between `base` and the working tree (committed or not), from git.
    Raises ValueError in one sentence when git cannot answer."""
    root = repo or Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "diff", "--name-only", base], cwd=root, capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ValueError(f"git diff against '{base}' failed: {exc}")
    if out.returncode != 0:
        reason = out.stderr.strip().splitlines()[0] if out.stderr.strip() else "unknown error"
        raise ValueError(f"git diff against '{base}' failed: {reason}")
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard"], cwd=root,
                               capture_output=True, text=True, timeout=60).stdout
    return [line for line in (out.stdout + untracked).splitlines() if line.strip()]
