"""A sweep: run every case, stream rows to CSV, then render the reports."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from harness.cases import Case
from harness.environment import device, run_fields
from harness.declaration import OpSpec
from harness.results import ResultWriter, read_finished
from harness.checks import EXTRA_CHECKS, checks_per_case
from harness.execution import describe_error
from harness.runner import Implementation, run_case, run_row
from harness.progress import SlowStepClock
from harness.supervisor import WRITING, CaseInProgress, death_message, drop_marker, read_marker


class DeviceLost(RuntimeError):
    """The GPU context died during a case (a kernel's illegal or misaligned memory access is
    sticky: every later CUDA call in the process fails), so nothing more can run in this process.
    The case's rows, up to where it died, are already written."""


def device_healthy(dev) -> bool:
    """False when the CUDA context can no longer run work."""
    if dev.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(dev)
        return torch.ones(1, device=dev).add_(1).item() == 2
    except Exception:  # any failure here means the context is gone
        return False


@dataclass
class SweepOutcome:
    csv_path: Path
    html_path: Path | None
    markdown_path: Path | None
    wall_s: float
    cases_run: int
    cases_skipped: int
    interrupted: bool = False   # Ctrl-C: the reports hold the cases that finished
    dropped: str = ""           # what `--resume` dropped of an incomplete case, and why


def run_sweep(plan: list[tuple[OpSpec, Case, list[Implementation]]], out_dir: Path, run_id: str,
              resume: bool = False, progress: bool = True, checks=EXTRA_CHECKS,
              cache=None, healthy=device_healthy, echo=print, case_checks=None) -> SweepOutcome:
    """Run the planned cases in order; each case's rows reach the CSV as it finishes. `cache`: a
    GoldenCache, or None to compute every golden. With `resume`, the cases the CSV already holds
    whole are skipped, so the run ends with the rows of one that was never interrupted.

    After every case `healthy(device)` is asked whether the GPU context survived; when it did
    not, the case's rows up to its first error and an ERROR row saying so are written and
    DeviceLost is raised (the caller goes on in a new process with `resume`). Ctrl-C stops
    after the rows of the finished cases and renders the reports of those.

    The case under way is recorded in the run folder until its rows are written
    (harness.supervisor.MARKER); a record found by `resume` is a case whose process died: it gets
    ERROR rows and is done, unless the sweep had been stopped from outside during it (it runs
    again). `case_checks`: the checks of each planned case, when the plan is part of a larger one
    (harness.checks.checks_per_case of the whole plan)."""
    out_dir = Path(out_dir)
    run = open_run(out_dir, run_id, resume, echo)
    dev = device()
    start = time.perf_counter()
    ran = skipped = failures = 0
    interrupted = False
    case_checks = checks_per_case(plan, checks) if case_checks is None else case_checks
    with ResultWriter(run.csv_path) as writer:
        died = read_marker(out_dir) if resume else None
        if died is not None:
            failures += write_death(died, plan, run.done, writer, run.shared, echo)
            drop_marker(out_dir)
        bar = tqdm(plan, desc="cases", unit="case", disable=not progress, dynamic_ncols=True)
        clock = SlowStepClock(lambda text: bar.set_postfix_str(text), enabled=progress)
        try:
            for (spec, case, impls), own_checks in zip(bar, case_checks):
                if case.case_id in run.done:
                    skipped += 1
                    continue
                where = clock.watch(CaseInProgress(out_dir, case.case_id))
                try:
                    rows, lost = case_rows(spec, case, impls, dev, own_checks, cache, where, healthy)
                    failures += sum(r["verdict"] in ("FAIL", "ERROR") for r in rows)
                    where["step"] = WRITING
                    writer.write_case([{**run.shared, **r} for r in rows])
                finally:
                    where.finish()   # a process that dies before this leaves the marker behind
                if lost:
                    raise DeviceLost(f"the GPU context was lost in case {case.case_id}: "
                                     f"{rows[-1]['message']}")
                ran += 1
                bar.set_postfix_str(f"{case.op} {case.dtype} T={case.T} bad rows={failures}")
        except KeyboardInterrupt:
            interrupted = True
        finally:
            clock.stop()
            bar.close()
    return run.outcome(time.perf_counter() - start, ran, skipped, interrupted)


@dataclass
class OpenRun:
    """A run folder's results file as a sweep starts writing it: the cases it already holds whole
    (with --resume), the run id they carry, and the columns every row of the run shares."""
    out_dir: Path
    csv_path: Path
    run_id: str
    shared: dict
    done: set
    dropped: str

    def outcome(self, wall: float, ran: int, skipped: int, interrupted: bool) -> SweepOutcome:
        """Render the reports of the rows written, and say what the run did."""
        html_path, md_path = _render(self.csv_path, self.out_dir,
                                     {"run_id": self.run_id, "wall_s": wall, **self.shared})
        return SweepOutcome(self.csv_path, html_path, md_path, wall, ran, skipped, interrupted,
                            self.dropped)


def open_run(out_dir: Path, run_id: str, resume: bool, echo=print) -> OpenRun:
    """The results file of `out_dir`: read back for --resume (its incomplete cases dropped, and
    said so), else started afresh."""
    csv_path = Path(out_dir) / "results.csv"
    finished = read_finished(csv_path) if resume and csv_path.exists() else None
    if finished is not None and finished.dropped:
        echo(finished.dropped, flush=True)
    if not resume and csv_path.exists():
        csv_path.unlink()
    run_id = (finished and finished.run_id) or run_id
    return OpenRun(Path(out_dir), csv_path, run_id, {"run_id": run_id, **run_fields()},
                   set(finished.cases) if finished else set(), finished.dropped if finished else "")


def case_rows(spec: OpSpec, case: Case, impls, dev, checks, cache, where: dict,
              healthy=device_healthy) -> tuple[list[dict], bool]:
    """The case's rows, and whether the GPU context was lost in it (then the rows end at the
    first error, with an ERROR row saying so). An exception that escapes the case propagates
    unless the context died with it."""
    try:
        rows, error = run_case(spec, case, impls, dev, checks, cache, where), None
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        if healthy(dev):
            raise
        rows, error = [], f"{describe_error(exc)}, surfaced during {where.get('step')}"
    lost = error is not None or not healthy(dev)
    return (_rows_before_loss(rows, case, impls, error) if lost else rows), lost


def write_death(marker: dict, plan, done: set, writer: ResultWriter, shared: dict, echo) -> int:
    """The ERROR rows of the case an earlier process died in (`marker`), for the implementation
    that was running (for each, when that is unknown), written as the case's rows and the case
    added to `done`, so it is never run again; their number. Nothing when the case is done or
    not in the plan, or when the death came while its rows were written or after the sweep was
    stopped from outside (harness.supervisor.note_stop): it runs again."""
    case_id = marker.get("case_id")
    entry = next(((case, impls) for _, case, impls in plan if case.case_id == case_id), None)
    if entry is None or case_id in done or marker.get("step") == WRITING:
        return 0
    if marker.get("stopped"):
        echo(f"case {case_id} was under way when the sweep was stopped ({marker['stopped']}) and its "
             "processes killed: it runs again", flush=True)
        return 0
    case, impls = entry
    suspects = [i for i in impls if i.variant == marker.get("variant")] or impls
    message = death_message(marker)
    rows = [run_row(case, impl, "ERROR", message[:500]) for impl in suspects]
    writer.write_case([{**shared, **r} for r in rows])
    done.add(case_id)
    echo(f"case {case_id}: {message}", flush=True)
    return len(rows)


def _rows_before_loss(rows: list[dict], case: Case, impls, error: str | None) -> list[dict]:
    """The case's rows up to its first ERROR (after that every CUDA call fails, so later rows say
    nothing about their kernels), then an ERROR row saying the context was lost, for the
    implementation that was running when it surfaced (for each, when that is unknown)."""
    first = next((i for i, r in enumerate(rows) if r["verdict"] == "ERROR"), None)
    if first is None:
        kept, cause, suspects = rows, error or "a CUDA call after the case failed", impls
    else:
        kept, cause = rows[:first + 1], rows[first]["message"]
        suspects = [i for i in impls if i.variant == rows[first]["variant"]] or impls
    message = (f"the GPU context was lost during this case ({cause}); the checks after that were "
               "not run, and the sweep went on in a new process")
    return kept + [run_row(case, impl, "ERROR", message[:500]) for impl in suspects]


SLOW_REPORT_ROWS = 20_000   # a run's reports take seconds from here: say so before the wait


def _render(csv_path: Path, out_dir: Path, meta: dict):
    from reports import read_results, write_html, render_markdown
    df = read_results([csv_path])
    if len(df) >= SLOW_REPORT_ROWS:
        print(f"writing the reports of {len(df):,} rows", flush=True)
    html_path = out_dir / "report.html"
    write_html(df, html_path, meta)
    md_path = out_dir / "summary.md"
    md_path.write_text(render_markdown(df, meta))
    return html_path, md_path
