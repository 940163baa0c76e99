"""The folder a run writes into: checked before anything runs, so that a mistake costs one line
and exit 2, never a half-made run or the loss of an earlier one."""
from __future__ import annotations

import csv
import tempfile
from pathlib import Path

RUN_FILES = ("results.csv", "report.html", "summary.md", "compare.html", "gate-summary.md",
             "in_progress.json", "plan.json")   # harness.supervisor.MARKER, harness.shards.PLAN_FILE


class RunFolderError(ValueError):
    """The run folder cannot be used as asked: one sentence."""


def _holds_run(folder: Path) -> list[Path]:
    """The files of an earlier run in `folder`: its own, and those of a gate's sweeps at any depth
    (<op>/ or <op>/part<i>/), whose stale results the gate would otherwise read as its own."""
    return [path for name in RUN_FILES for path in sorted(folder.rglob(name)) if path.is_file()]


def _rows(path: Path) -> int:
    with open(path, newline="") as f:
        return max(0, sum(1 for _ in csv.reader(f)) - 1)


def prepare(out: Path | None, default: Path, resume: bool = False, force: bool = False) -> Path:
    """The run folder (`out`, else `default`), created and known to be writable.

    Refuses: --resume with --force, or without --out, or where no results.csv is; --out that is a
    file; a folder that holds an earlier run unless --resume continues it or --force replaces it
    (then its run files are removed here); a folder that cannot be created or written."""
    if resume and force:
        raise RunFolderError("--resume continues the run in --out and --force replaces it: give one")
    if resume and out is None:
        raise RunFolderError("--resume needs --out, the folder of the run to continue")
    folder = Path(out) if out is not None else Path(default)
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(f"--out {folder} is a file, not a folder")
    if resume:
        if not (folder / "results.csv").is_file():
            raise RunFolderError(f"nothing to resume in {folder}: it has no results.csv")
    else:
        earlier = _holds_run(folder) if folder.is_dir() else []
        if earlier and not force:
            csvs = [p for p in earlier if p.name == "results.csv"]
            rows = sum(_rows(p) for p in csvs)
            held = f"{rows} result rows" if csvs else ", ".join(p.name for p in earlier)
            raise RunFolderError(f"{folder} already holds a run ({held}); --resume continues it, "
                                 "--force replaces it")
        for path in earlier:
            path.unlink()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise RunFolderError(f"cannot write in {folder}: {exc.strerror or exc}") from None
    return folder
