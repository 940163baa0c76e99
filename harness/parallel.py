"""A sweep spread over worker processes: one per GPU by default, each seeing one device.

The dealing process starts the workers, hands each the next case as it frees up (the costliest
first, so the long cases do not end the run alone, each worker keeping to one op while it has
cases, so an op's first calls compile in few processes), and is the only writer of results.csv: a case's
rows reach it whole, as the case finishes, whichever worker ran it. A worker whose GPU context
dies, or whose process dies, costs only its case (ERROR rows saying how, as in a one-process
sweep); a new worker takes its device. Workers sharing a device (a GPU, or the CPU) share its
memory: a case that runs out of it there runs again once the cases beside it are smaller than it
(`may_run_again`), and, out of memory again, once more alone on its device after the others; a case
whose worker dies there runs again alone. Only the last run's rows are written. The workers
rebuild the plan from the sweep's own arguments, so a case is known by its place in the plan."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

from harness import progress
from harness.supervisor import CaseInProgress, describe_exit

DEVICES = "CUDA_VISIBLE_DEVICES"


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them ([] without CUDA)."""
    import torch
    if not torch.cuda.is_available():
        return []
    named = [d.strip() for d in os.environ.get(DEVICES, "").split(",") if d.strip()]
    return named[:torch.cuda.device_count()] or [str(i) for i in range(torch.cuda.device_count())]


def default_jobs() -> int:
    """One worker per visible GPU; one process on a CPU or a one-GPU machine."""
    return max(1, len(visible_gpus()))


def worker_devices(jobs: int) -> list[str | None]:
    """The device each of `jobs` workers sees: the GPUs in turn, or None (as this process) on CPU."""
    gpus = visible_gpus()
    return [gpus[i % len(gpus)] if gpus else None for i in range(jobs)]


# A case's fixed work (launches, checks, small goldens) in units of its size term below. Measured
# on 4 H200 over the bf16 gpu preset of every op: shard 1/96 (one case, B2 T43884 H4 K=V=256, size
# 2.3e10) ran 7.9 s on one GPU, shard 1/48 (91 cases, size 3.8e10) 177 s, so a case costs about
# 1.8 s plus 2.6e-10 s per unit; without this part a shard of one large case was dealt as much
# work as one of 91 (benchmarks/multi_gpu.md).
CASE_OVERHEAD = 7 * 10**9


def case_size(case) -> int:
    """A case's tokens times its state size: what its work and memory grow with."""
    return case.B * case.T * max(case.H, 1) * max(case.K, 1) * max(case.V, 1)


def case_cost(case) -> int:
    """A case's work, roughly: CASE_OVERHEAD plus its size."""
    return CASE_OVERHEAD + case_size(case)


def dealing_order(plan, indices) -> list[int]:
    """`indices` of the plan, costliest case first (plan order among equals)."""
    return sorted(indices, key=lambda i: -case_cost(plan[i][1]))


def _put(values: dict):
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def may_run_again(index: int, plan, beside: list[int], retrying: set) -> bool:
    """Whether case `index`, out of memory beside other workers on a device, may run again beside
    the cases `beside` it there now: when it is larger than they are together and none of them is
    a retry too (`retrying`). The costliest cases are dealt first, so a retry waits out the large
    ones and runs beside the small ones left, rather than alone after all."""
    return not retrying.intersection(beside) and case_size(plan[index][1]) > sum(
        case_size(plan[i][1]) for i in beside)


def next_case(todo: list[int], plan, own_op: str | None, others: set) -> int:
    """Where in `todo` (costliest first) a worker's next case is: the costliest of the op it ran
    last, else of an op no other worker is on (`others`), else the costliest. A worker so keeps
    to one op: an op's first calls, which compile, and autotune upstream kernels for minutes, run
    in few processes, and a cold sweep of several ops ends near the time of its slowest op."""
    ops = [plan[i][1].op for i in todo]
    for wanted in (lambda op: op == own_op, lambda op: op not in others):
        found = next((n for n, op in enumerate(ops) if wanted(op)), None)
        if found is not None:
            return found
    return 0


@contextmanager
def _environment(**values):
    """os.environ with `values` set (None: removed) while a worker process starts."""
    old = {key: os.environ.get(key) for key in values}
    try:
        _put(values)
        yield
    finally:
        _put(old)


def threads_per_worker(jobs: int) -> int:
    """CPU threads each of `jobs` processes may use: torch would give every one all the cores."""
    return max(1, (os.cpu_count() or 1) // jobs)


def _worker(argv: list[str], conn, threads: int):
    """A worker's life: rebuild the plan from the sweep's arguments, then run the cases the dealer
    sends (their index in the plan) until told to stop or its GPU context is lost. It runs in a
    process group of its own: a terminal's Ctrl-C is the dealer's to act on, and must not kill
    the compilers a worker runs (a compile that dies is an ERROR row, not an interruption)."""
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch
    torch.set_num_threads(threads)
    import fla_kernels  # noqa: F401  (the Triton interpreter is set up before any kernel is defined)
    from harness.cli import sweep_setup
    from harness.environment import device
    from harness.sweep import case_rows
    setup = sweep_setup(argv)
    dev = device()
    conn.send(("ready",))
    while True:
        try:
            index = conn.recv()
        except EOFError:   # the dealer is gone
            return
        if index is None:
            return
        spec, case, impls = setup.plan[index]
        where = CaseInProgress(None, case.case_id, send=lambda where: conn.send(("step", where)))
        rows, lost = case_rows(spec, case, impls, dev, setup.case_checks[index], setup.cache, where)
        conn.send(("rows", index, rows, lost))
        if lost:   # the rows are in the pipe; a dead context's teardown can hang, so none is run
            os._exit(0)


def _end(process, grace_s: float = 30.0, ask: bool = False):
    """Wait for a worker that is done to exit (asked to with SIGTERM when `ask`: an interrupted
    sweep's); kill it if it has not within `grace_s`, so that no worker, stuck in a compile or in
    its GPU's driver, holds the sweep's end (an interrupted sweep waited on each without limit)."""
    if ask:
        process.terminate()
    process.join(timeout=grace_s)
    if process.is_alive():
        process.kill()
        process.join(timeout=grace_s)


@dataclass
class _Slot:
    """One worker place: the device it sees, its process, and the case it runs."""
    number: int
    device: str | None
    process: multiprocessing.Process | None = None
    conn: object = None
    ready: bool = False
    case: int | None = None
    where: dict = field(default_factory=dict)
    step_since: float = 0.0
    op: str | None = None       # the op of its last case: it keeps to one (next_case)
    bar: object = None

    def label(self) -> str:
        return f"worker {self.number}" + (f" (GPU {self.device})" if self.device is not None else "")


def ran_out_of_memory(rows: list[dict]) -> bool:
    """Whether a case's rows hold an ERROR of its device's memory running out (torch's or
    Triton's), which workers sharing the device may have caused."""
    return any(r["verdict"] == "ERROR" and "out of memory" in str(r.get("message", "")).lower() for r in rows)


class WorkersFailed(RuntimeError):
    """No worker could start, so the cases left cannot run."""


def run_parallel_sweep(argv: list[str], plan, indices, out_dir: Path, run_id: str, jobs: int,
                       resume: bool = False, progress: bool = True, echo=print):
    """Run the planned cases `indices` in `jobs` worker processes (harness.sweep.run_sweep's
    contract: the rows of a one-process run, resumable, a SweepOutcome)."""
    from harness.results import ResultWriter
    from harness.sweep import write_death, open_run
    from harness.supervisor import drop_marker, read_marker

    run = open_run(Path(out_dir), run_id, resume, echo)
    start = time.perf_counter()
    with ResultWriter(run.csv_path) as writer:
        died = read_marker(out_dir) if resume else None   # left by a one-process run of this folder
        bad = 0
        if died is not None:
            bad = write_death(died, plan, run.done, writer, run.shared, echo)
            drop_marker(out_dir)
        todo = [i for i in dealing_order(plan, indices) if plan[i][1].case_id not in run.done]
        dealer = _Dealer(argv, plan, todo, writer, run, jobs, progress, echo, bad)
        try:
            dealer.run()
        except KeyboardInterrupt:
            dealer.interrupted = True
        finally:
            dealer.close()
    left = len(dealer.todo) + len(dealer.again) + len(dealer.alone)
    if left and not dealer.interrupted:
        raise WorkersFailed(f"no worker could start; {left} case(s) not run (the workers' errors "
                            "are above)")
    return run.outcome(time.perf_counter() - start, dealer.ran, len(indices) - len(todo),
                       dealer.interrupted)


class _Dealer:
    """Hands cases to workers as they free up and writes each case's rows as it comes back."""

    def __init__(self, argv, plan, todo, writer, run, jobs, progress, echo, bad=0):
        from tqdm import tqdm
        self.argv, self.plan, self.todo, self.writer, self.run_ = argv, plan, list(todo), writer, run
        self.echo, self.bad, self.ran, self.interrupted = echo, bad, 0, False
        self.context = multiprocessing.get_context("spawn")
        self.bar = tqdm(total=len(todo), desc="cases", unit="case", disable=not progress,
                        dynamic_ncols=True)
        self.slots = [_Slot(n + 1, d) for n, d in enumerate(worker_devices(min(jobs, max(1, len(todo)))))]
        self.threads = threads_per_worker(len(self.slots))
        devices = [s.device for s in self.slots]
        self.shared = {d for d in devices if devices.count(d) > 1}   # devices (None: the CPU) shared
        self.again = []        # cases out of memory beside others, to run again (may_run_again)
        self.retrying = set()  # cases dealt from `again`: out of memory once more, they run alone
        self.alone = []        # cases to run again alone on a device, after the others
        self.retried = set()   # cases dealt from `alone`: their rows stand
        for slot in self.slots:
            slot.bar = tqdm(total=0, position=slot.number, bar_format="{desc}", disable=not progress,
                            leave=False)

    def run(self):
        if not self.todo:
            return
        for slot in self.slots:
            self._start(slot)
        while any(s.process is not None for s in self.slots):
            live = {s.conn: s for s in self.slots if s.process is not None}
            for conn in wait(list(live), timeout=progress.TICK_S):
                self._receive(live[conn])
            for slot in self.slots:
                if slot.process is not None and slot.ready and slot.case is None:
                    self._deal(slot)   # it waits for a retry: the cases beside may allow one now
            self._show_slow_steps()

    def _show_slow_steps(self):
        now = time.monotonic()
        for slot in self.slots:
            step = slot.where.get("step")
            slow = step and now - slot.step_since >= progress.SLOW_STEP_S
            if slot.process is not None and slot.case is not None and slow:
                slot.bar.set_description_str(f"{slot.label()}: " + progress.slow_step_text(
                    self._case_id(slot.case), step, now - slot.step_since)[:160])

    def _start(self, slot: _Slot):
        parent, child = self.context.Pipe()
        with _environment(**({DEVICES: slot.device} if slot.device is not None else {})):
            slot.process = self.context.Process(target=_worker, daemon=True,
                                                args=(self.argv, child, self.threads))
            slot.process.start()
        child.close()
        slot.conn, slot.ready, slot.case, slot.where = parent, False, None, {}
        slot.bar.set_description_str(f"{slot.label()}: starting")

    def _deal(self, slot: _Slot):
        """The next case to the slot's worker: a case to run again, where the cases beside it on
        the slot's device allow (`may_run_again`), else the next of the others. With none to deal
        while a retry waits, the worker waits too. Once every case is dealt, a case to run again
        alone goes to a worker with no other left on its device; the others stop, so that one is
        left on each."""
        slot.where, finished, slot.case = {}, slot.case, None
        beside = [s.case for s in self.slots if s is not slot and s.case is not None
                  and s.process is not None and s.device == slot.device]
        if self.again and may_run_again(self.again[0], self.plan, beside, self.retrying):
            index = self.again.pop(0)
            self.retrying.add(index)
            self._send(slot, index)
        elif self.todo:
            others = {self.plan[s.case][1].op for s in self.slots if s is not slot and s.case is not None}
            self._send(slot, self.todo.pop(next_case(self.todo, self.plan, slot.op, others)))
        elif self.again:
            if finished is not None:
                slot.bar.set_description_str(f"{slot.label()}: waiting for a case out of memory to run again")
        elif self.alone and not any(s is not slot and s.process is not None and s.device == slot.device
                                    for s in self.slots):
            index = self.alone.pop(0)
            self.retried.add(index)
            self._send(slot, index)
        else:
            slot.conn.send(None)
            _end(slot.process)
            slot.process = None
            slot.bar.set_description_str(f"{slot.label()}: done")

    def _send(self, slot: _Slot, index: int):
        slot.case, slot.op = index, self.plan[index][1].op
        slot.conn.send(index)
        slot.bar.set_description_str(f"{slot.label()}: {self._case_id(index)}")

    def _set_aside(self, slot: _Slot, index: int, died: bool = False) -> bool:
        """Whether case `index`, out of memory or dead beside other workers on the slot's device,
        is put aside to run again: out of memory the first time, once those beside it are smaller
        (`may_run_again`); else alone there after the others. After that its rows stand."""
        if slot.device not in self.shared or index in self.retried:
            return False
        if not died and index not in self.retrying:
            self.again = dealing_order(self.plan, self.again + [index])
            self.echo(f"{slot.label()}: case {self._case_id(index)} ran out of memory beside other "
                      "workers on its device; it runs again once those beside it there are smaller", flush=True)
            return True
        why = "died" if died else "ran out of memory again"
        self.alone.append(index)
        self.echo(f"{slot.label()}: case {self._case_id(index)} {why} beside other workers on its device; "
                  "it runs again alone there after the others", flush=True)
        return True

    def _case_id(self, index) -> str:
        return self.plan[index][1].case_id

    def _receive(self, slot: _Slot):
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            self._died(slot)
            return
        kind = message[0]
        if kind == "ready":
            slot.ready = True
            self._deal(slot)
        elif kind == "step":
            if message[1].get("step") != slot.where.get("step"):
                slot.step_since = time.monotonic()
            slot.where = message[1]
            slot.bar.set_description_str(
                f"{slot.label()}: {self._case_id(slot.case)}: {slot.where.get('step') or ''}"[:160])
        else:
            _, index, rows, lost = message
            if not (ran_out_of_memory(rows) and self._set_aside(slot, index)):
                self._write(index, rows)
            if lost:
                self.echo(f"{slot.label()}: the GPU context was lost in case {self._case_id(index)}; "
                          "a new worker takes its device", flush=True)
                _end(slot.process)
                self._start(slot)
            else:
                self._deal(slot)

    def _write(self, index: int, rows: list[dict]):
        self.bad += sum(r["verdict"] in ("FAIL", "ERROR") for r in rows)
        self.writer.write_case([{**self.run_.shared, **r} for r in rows])
        self.run_.done.add(self._case_id(index))
        self.ran += 1
        self.bar.update(1)
        self.bar.set_postfix_str(f"bad rows={self.bad}")

    def _died(self, slot: _Slot):
        """A worker's process ended unasked: its case (if any) gets the ERROR rows of a death, and
        a new worker takes the slot; one that died before it was ready leaves the slot empty."""
        from harness.sweep import write_death
        slot.process.join(timeout=30)
        code = slot.process.exitcode
        cause = describe_exit(code) if code is not None else "its process stopped answering"
        slot.process = None
        if not slot.ready:
            self.echo(f"{slot.label()} could not start ({cause}); its device is left out", flush=True)
            slot.bar.set_description_str(f"{slot.label()}: could not start")
            return
        self.echo(f"{slot.label()} died ({cause}) in case {self._case_id(slot.case)}; a new worker "
                  "takes its device", flush=True)
        if not self._set_aside(slot, slot.case, died=True):
            marker = {"case_id": self._case_id(slot.case), **slot.where, "died": cause}
            self.bad += write_death(marker, self.plan, self.run_.done, self.writer, self.run_.shared,
                                     self.echo)
            self.ran += 1
            self.bar.update(1)
        self._start(slot)

    def close(self):
        for slot in self.slots:
            if slot.process is not None:
                _end(slot.process, grace_s=10.0, ask=True)
            slot.bar.close()
        self.bar.close()
