"""A sweep survives its process dying in the middle of a case (a compiler's or driver's SIGABRT or
SIGSEGV, an os._exit): the case in progress is recorded in the run folder before it runs, and
`python -m harness sweep` runs the sweep in a child process. When the child ends with that record
still there, the case died: the record takes the cause, and the same sweep continues with
--resume in a new child, which writes the case's ERROR rows (harness.sweep) and goes on. A
`--resume` by hand finds the record the same way, except where a stop signal had reached the
supervisor during the case before the whole process tree was killed: that case runs again.

Light on purpose (no torch): the supervising process only starts, watches and restarts workers.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARKER = "in_progress.json"          # the case under way, beside results.csv
STOPPED = "stopped.json"             # beside it: the sweep was stopped from outside during that case
WORKER = "HARNESS_SWEEP_WORKER"      # set in a supervised sweep: the file it names its run folder in
WRITING = "writing the case's rows"  # the last step: a death here is the writer's, not the case's
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)   # passed on to the worker, never restarted


class CaseInProgress(dict):
    """The `where` dict of a running case (`variant`, `step`), mirrored on every change into the
    run folder's marker, so a process that dies leaves the case and step it died in, or, in a
    worker of a parallel sweep, sent to the dealer (`send`), which keeps it for the same end."""

    def __init__(self, folder: Path | None, case_id: str, send=None):
        super().__init__()
        self.path = None if folder is None else Path(folder) / MARKER
        self.case_id, self.send = case_id, send
        self.step_since = time.monotonic()   # when the step under way began (for the progress)
        self._write()

    def __setitem__(self, key, value):
        self.update({key: value})

    def update(self, *args, **kwargs):
        before = self.get("step")
        super().update(*args, **kwargs)
        if self.get("step") != before:
            self.step_since = time.monotonic()
        self._write()

    def _write(self):
        if self.path is not None:
            _write_json(self.path, {"case_id": self.case_id, **self})
        if self.send is not None:
            self.send(dict(self))

    def finish(self):
        """The case ended in this process (rows written, or interrupted): no death to record."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def _write_json(path: Path, data: dict):
    """Replace `path` atomically: a reader sees the old content or the new, never half of it."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):   # unreadable: known by nothing, so nothing is recorded
        return None


def read_marker(folder) -> dict | None:
    """The record of the case a process was running when it ended, or None; with "stopped" (the
    signal's name) when the sweep was stopped from outside during that case (`note_stop`)."""
    marker = _read_json(Path(folder) / MARKER)
    stop = _read_json(Path(folder) / STOPPED)
    if marker is not None and stop is not None and stop.get("case_id") == marker.get("case_id"):
        marker["stopped"] = stop.get("signal")
    return marker


def note_stop(folder, signum: int):
    """Beside the marker of the case under way, that a stop signal reached the supervisor. A worker
    inside a long compile does not take SIGINT, and `timeout -k` then kills the whole process
    tree, marker left behind: the case did not end its process, so a --resume runs it again
    instead of writing it a death's ERROR rows."""
    marker = _read_json(Path(folder) / MARKER)
    if marker is not None:
        _write_json(Path(folder) / STOPPED, {"case_id": marker.get("case_id"),
                                             "signal": signal.Signals(signum).name})


def drop_marker(folder):
    for name in (MARKER, STOPPED):
        (Path(folder) / name).unlink(missing_ok=True)


def death_message(marker: dict) -> str:
    """The ERROR rows' message for the case a process died in."""
    cause = marker.get("died") or ("how is not recorded: the run was found so by --resume, e.g. "
                                   "after the whole process tree was killed")
    step = marker.get("step") or "its start"
    return (f"the sweep process died during this case ({cause}), during {step}; nothing of the "
            "case was kept, and the sweep went on in a new process")


def describe_exit(code: int) -> str:
    """'killed by SIGABRT' or 'exit code 3'."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def without_run_folder(argv: list[str]) -> list[str]:
    """`argv` without --out, --resume and --force (to add the ones of a continued run)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--resume", "--force") or arg.startswith("--out="):
            continue
        elif arg == "--out":
            skip = True
        else:
            out.append(arg)
    return out


def resume_arguments(argv: list[str], out) -> list[str]:
    return [*without_run_folder(argv), "--resume", "--out", str(out)]


def resume_command(argv: list[str], out) -> str:
    """The command line that continues this sweep in `out`."""
    return shlex.join(["python", "-m", "harness", *resume_arguments(argv, out)])


def supervised(argv: list[str]) -> bool:
    """Whether `python -m harness argv` is a sweep to run in a worker (not already one)."""
    return bool(argv) and argv[0] == "sweep" and not os.environ.get(WORKER)


def tell_run_folder(out: Path):
    """In a worker: tell the supervisor the run folder, where it looks for the marker."""
    note = os.environ.get(WORKER)
    if note:
        Path(note).write_text(str(Path(out).resolve()))


def interrupt_once_per_press():
    """In a worker: one KeyboardInterrupt per Ctrl-C. A terminal's Ctrl-C reaches the worker and
    the supervisor, which passes it on (a SIGINT sent to it alone must stop the sweep too)."""
    last = [-1e9]

    def handler(signum, frame):
        now = time.monotonic()
        if now - last[0] > 1.0:
            last[0] = now
            raise KeyboardInterrupt
    signal.signal(signal.SIGINT, handler)


def supervise(argv: list[str], echo=print) -> int:
    """Run the sweep `argv` in workers until one ends without leaving a case in progress; the
    exit code is the last worker's (0, 1, 2, 130), or 128 + the signal that killed one outside
    any case. A case that kills its worker gets its ERROR rows once: the same marker again stops."""
    fd, note = tempfile.mkstemp(prefix="harness-sweep-", suffix=".folder")
    os.close(fd)
    env = {**os.environ, WORKER: note}
    seen, args = set(), argv
    try:
        while True:
            code, stop = _run_worker(args, env)
            folder = Path(note).read_text().strip() or None
            marker = read_marker(folder) if folder else None
            if marker is None:
                if folder:
                    drop_marker(folder)   # a stop noted in a case the worker then ended itself
                return _status(code)
            key = (marker.get("case_id"), marker.get("step"))
            if stop is not None or key in seen:
                if stop is not None:   # stopped from outside: the case did not die of itself
                    drop_marker(folder)
                echo(f"the sweep stopped during case {key[0]} ({describe_exit(code)}); continue "
                     f"with\n  {resume_command(argv, folder)}", flush=True)
                return max(_status(code), 1)
            seen.add(key)
            cause = describe_exit(code)
            _write_json(Path(folder) / MARKER, {**marker, "died": cause})
            echo(f"the sweep process died during case {key[0]} ({cause}, during {key[1]}); going "
                 f"on in a new process: the same sweep with --resume --out {folder}", flush=True)
            args = resume_arguments(argv, folder)
    finally:
        os.unlink(note)


def _status(code: int) -> int:
    """The exit status a shell shows for a return code: 128 + the signal for a killed process."""
    return code if code >= 0 else 128 - code


def _run_worker(args: list[str], env: dict) -> tuple[int, int | None]:
    """Run one worker to its end, passing on SIGINT, SIGTERM and SIGHUP, each noted beside the
    case under way (`note_stop`); (its return code, the stop signal received meanwhile or None)."""
    proc = subprocess.Popen([sys.executable, "-m", "harness", *args], env=env)
    stop = []

    def forward(signum, frame):
        stop.append(signum)
        folder = Path(env[WORKER]).read_text().strip()
        if folder:
            note_stop(folder, signum)
        proc.send_signal(signum)   # nothing once the worker has been waited for
    previous = {s: signal.signal(s, forward) for s in STOPS}
    try:
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code, (stop[0] if stop else None)
