"""The streaming long-form CSV: rows are appended and flushed as each case finishes."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from harness.schema import COLUMNS


class ResultWriter:
    """Appends rows to a CSV (header written once); safe to resume into an existing file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = open(self.path, "a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=COLUMNS, extrasaction="raise")
        if new:
            self._writer.writeheader()
            self._file.flush()

    def write(self, rows: list[dict]):
        for row in rows:
            self._writer.writerow({c: _cell(row.get(c, "")) for c in COLUMNS})
        self._file.flush()

    def close(self):
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _cell(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def finished_cases(path: Path) -> tuple[set, str | None]:
    """case_ids that already have rows in `path`, and the run id they were written under."""
    path = Path(path)
    if not path.exists():
        return set(), None
    done, run_id = set(), None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            done.add(row["case_id"])
            run_id = run_id or row["run_id"]
    return done, run_id
