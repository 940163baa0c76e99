"""The streaming long-form CSV: each case's rows are appended and flushed as it finishes, and a
run folder is read back for `--resume` so that the resumed run ends with the rows of one that was
never interrupted."""
from __future__ import annotations

import collections
import csv
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path

from harness.run_folder import RunFolderError
from reports.schema import COLUMNS


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

    def write_case(self, rows: list[dict]):
        """All rows of one case, each carrying their number (`case_rows`), flushed to disk."""
        for row in rows:
            self._writer.writerow({c: _cell(row.get(c, "")) for c in COLUMNS} | {"case_rows": len(rows)})
        self._file.flush()
        os.fsync(self._file.fileno())

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


@dataclass
class Finished:
    """What a results file already holds: the cases with all their rows, the run id they were
    written under, and a sentence about any case that had to be dropped ("" when none)."""
    cases: set
    run_id: str | None
    dropped: str


def read_finished(path: Path) -> Finished:
    """The complete cases of `path`, after rewriting it without the rows of incomplete ones.

    A case is complete when it has as many well-formed rows as its `case_rows` says. A row cut
    short (the last line of a sweep killed while writing it), or a case with fewer rows than it
    wrote, is dropped with every other row of its case, so that `--resume` runs the case again.
    Raises RunFolderError when the file is not a results file of this harness."""
    path = Path(path)
    with open(path, newline="") as f:
        text = f.read()
    records = list(csv.reader(io.StringIO(text)))
    if not records:
        return Finished(set(), None, "")
    if records[0] != COLUMNS:
        raise RunFolderError(f"{path} is not a results file of this version of the harness (its "
                         "columns differ); start the run again in another folder")
    body = records[1:]
    if body and not text.endswith("\n"):
        body[-1] = body[-1][:-1] or [""]  # the last line lost its end: its last field may be cut
    rows, suspects = [], set()
    for fields in body:
        if len(fields) == len(COLUMNS):
            rows.append(dict(zip(COLUMNS, fields)))
        elif len(fields) > 2:       # cut short after its case id: that case is incomplete
            suspects.add(fields[1])
        elif rows:                  # cut inside its case id: it may end the case before it
            suspects.add(rows[-1]["case_id"])
    torn = len(body) - len(rows)
    counts = collections.Counter(r["case_id"] for r in rows)
    complete = {case for case, n in counts.items()
                if all(r["case_rows"] == str(n) for r in rows if r["case_id"] == case)} - suspects
    kept = [r for r in rows if r["case_id"] in complete]
    dropped = ""
    if len(kept) < len(records) - 1:
        lost = sorted((set(counts) | suspects) - complete)
        cut = f"{torn} row(s) cut short; " if torn else ""
        dropped = (f"{path}: {cut}{len(records) - 1 - len(kept)} row(s) of {len(lost)} incomplete "
                   f"case(s) dropped, to run again: {', '.join(lost) or 'none'}")
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(kept)
        tmp.replace(path)
    run_id = kept[0]["run_id"] if kept else None
    return Finished(complete, run_id, dropped)
