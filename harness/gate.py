"""The gate on kernel pull requests: sweep the ops a change touches, compare with the committed
baseline of this device class, fail on any FAIL or ERROR row, on any err/bound that grew beyond
the declared factor plus the noise between machines, and on any row that disappeared.

baselines/gate.json declares the growth factor, the ratio floor under which growth is noise, the
noise allowance (roundings of the golden), and per device class the sweep arguments of the gate's
suite; baselines/<class>/<op>.csv hold the rows a previous run of that suite gave, and
machines.json the machine each was written on (both written by `gate --update-baseline`).
"""
from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import torch

from fla_kernels.utils import interpreting
from harness.registry import get_op
from reports.schema import BASELINE_COLUMNS

BASELINE_DIR = Path(__file__).resolve().parent.parent / "baselines"
MACHINES = "machines.json"   # per device class: op -> the machine its baseline was written on


class GateSetupError(ValueError):
    """The gate cannot run as asked (no baseline, a bad suite): one sentence, exit 2."""


@dataclass
class GateConfig:
    growth_factor: float
    ratio_floor: float
    noise_roundings: float  # roundings of the golden a correct kernel's err moves by between machines
    suites: dict            # device class -> {sweep option: value(s)}, or a list of them (parts)

    @classmethod
    def load(cls, directory: Path = BASELINE_DIR) -> "GateConfig":
        path = Path(directory) / "gate.json"
        if not path.exists():
            raise GateSetupError(f"no gate configuration at {path}")
        data = json.loads(path.read_text())
        missing = [k for k in ("growth_factor", "ratio_floor", "noise_roundings", "suites") if k not in data]
        if missing:
            raise GateSetupError(f"{path} lacks {', '.join(missing)}")
        return cls(float(data["growth_factor"]), float(data["ratio_floor"]),
                   float(data["noise_roundings"]), data["suites"])

    def comparison(self, growth_factor=None, ratio_floor=None, noise_roundings=None) -> tuple:
        """(growth factor, ratio floor, noise roundings) of a comparison: those given, else this
        configuration's."""
        given = (growth_factor, ratio_floor, noise_roundings)
        mine = (self.growth_factor, self.ratio_floor, self.noise_roundings)
        return tuple(m if g is None else g for g, m in zip(given, mine))

    def suite(self, device_class: str) -> list[dict]:
        """The sweeps of a device class's suite: one grid, or several whose cases together make
        the suite (a grid each, so no product of every axis with every other)."""
        if device_class not in self.suites:
            raise GateSetupError(f"baselines/gate.json has no suite for device class '{device_class}'; "
                                 f"it has {', '.join(sorted(self.suites))}")
        suite = self.suites[device_class]
        return suite if isinstance(suite, list) else [suite]


def device_class() -> str:
    """'cpu' under the Triton interpreter, else the GPU model in lower case ('h100', 'h200')."""
    if interpreting() or not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name()
    model = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", name)
    return (model.group(1) if model else re.sub(r"\W+", "_", name)).lower()


def suite_arguments(suite: dict) -> list[str]:
    """The sweep's command-line arguments for a suite ({"dtype": ["bf16"], "T": [1, 65], ...})."""
    args = []
    for option, value in suite.items():
        values = value if isinstance(value, list) else [value]
        args += [f"--{option.replace('_', '-')}", ",".join(str(v) for v in values)]
    return args


def baseline_paths(directory: Path, device_class: str, ops) -> dict:
    """op -> its baseline CSV; GateSetupError naming the first that is missing."""
    folder = Path(directory) / device_class
    paths = {op: folder / f"{op}.csv" for op in ops}
    missing = [op for op, p in paths.items() if not p.exists()]
    if missing:
        raise GateSetupError(f"no baseline for {', '.join(missing)} on '{device_class}' in {folder}; "
                             "make one with `python -m harness gate --update-baseline`")
    return paths


def op_suite(op: str, suite: dict) -> dict:
    """The suite as one op's sweep takes it: of its "option" values, "none" and the op's own."""
    if "option" not in suite:
        return suite
    own = get_op(op).all_options()
    return {**suite, "option": [o for o in suite["option"] if o == "none" or o in own]}


def sweep_command(op: str, suite: dict, out: Path, impls=(), cache_args=(), workers: int = 1) -> list[str]:
    command = [sys.executable, "-m", "harness", "sweep", "--op", op, *suite_arguments(op_suite(op, suite)),
               "--out", str(out), "--quiet", "--jobs", str(workers), *cache_args]
    for impl in impls:
        command += ["--impl", impl]
    return command


def run_sweeps(ops, suite: list[dict], out_dir: Path, impls=(), jobs: int = 1, cache_args=(),
               echo=print, workers: int = 1) -> list[tuple]:
    """Sweep each op in its own process per part of the suite, `jobs` at a time, each seeing one
    GPU in turn (harness.parallel.worker_devices) and dealing its cases to `workers` processes
    there (sweep --jobs); [(op, results CSV, exit code)]. Each sweep's output goes to
    <out_dir>/<op>[/part<i>]/sweep.log; a line is printed as each finishes."""
    from harness.parallel import DEVICES, threads_per_worker, worker_devices
    processes = jobs * workers
    threads = {"OMP_NUM_THREADS": str(threads_per_worker(processes))} if processes > 1 else {}
    devices = queue.Queue()
    for dev in worker_devices(max(1, jobs)):
        devices.put(dev)

    def one(op, i):
        folder = out_dir / op / (f"part{i}" if len(suite) > 1 else "")
        folder.mkdir(parents=True, exist_ok=True)
        dev = devices.get()
        env = {**os.environ, **threads, **({DEVICES: dev} if dev is not None else {})}
        start = time.perf_counter()
        try:
            with open(folder / "sweep.log", "w") as log:
                code = subprocess.run(sweep_command(op, suite[i], folder, impls, cache_args, workers),
                                      stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        finally:
            devices.put(dev)
        return op, folder / "results.csv", code, time.perf_counter() - start

    finished = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, op, i) for op in ops for i in range(len(suite))]
        for n, future in enumerate(as_completed(futures), 1):
            op, csv_path, code, wall = future.result()
            finished.append((op, csv_path, code))
            state = {0: "every row passed", 1: "rows failed"}.get(code, f"the sweep exited {code}")
            echo(f"[{n}/{len(futures)}] {op}: {state}, {wall:.0f} s (log {csv_path.parent / 'sweep.log'})",
                 flush=True)
    return finished


def write_baseline(frame, directory: Path, device_class: str, machine: dict) -> list[Path]:
    """Write the run's rows as the baseline of each op in it, and the machine they were made on
    into machines.json; returns the files written."""
    folder = Path(directory) / device_class
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for op, rows in frame.groupby("op", sort=False):
        path = folder / f"{op}.csv"
        rows[BASELINE_COLUMNS].to_csv(path, index=False, float_format="%.4g")  # 4 digits: ample for x2
        written.append(path)
    machines = baseline_machines(directory, device_class)
    machines.update({op: machine for op in frame["op"].unique()})
    (folder / MACHINES).write_text(json.dumps(dict(sorted(machines.items())), indent=1) + "\n")
    return written + [folder / MACHINES]


def baseline_machines(directory: Path, device_class: str) -> dict:
    """op -> the machine (harness.environment.machine) its baseline was written on."""
    path = Path(directory) / device_class / MACHINES
    return json.loads(path.read_text()) if path.exists() else {}


def machine_of(rows) -> dict:
    """The machine results were made on, as their rows record it (device, torch, triton): for
    `--results`, which may come from another machine than the one reading them."""
    return {column: ", ".join(sorted(map(str, rows[column].dropna().unique())))
            for column in ("device", "torch", "triton") if column in rows}


def _machine_text(machine: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in machine.items())


def gate_meta(selection, device_class_name: str, baseline_dir: Path, out: Path, crashed,
              machine: dict, label: str = "this machine") -> dict:
    meta = {"device class": device_class_name, "ops": selection.describe(),
            "baseline": str(Path(baseline_dir) / device_class_name), "results": str(out)}
    recorded = baseline_machines(baseline_dir, device_class_name)
    for op in selection.ops:
        if op in recorded and recorded[op] != machine:
            meta[f"baseline machine ({op})"] = _machine_text(recorded[op])
    meta[label] = _machine_text(machine)
    if crashed:
        meta["sweeps that did not finish"] = ", ".join(f"{op} (exit {code})" for op, code in crashed)
    return meta


def _selection(args, config_ops, results_ops=None):
    """The ops to gate and why: --op, the changed files, the ops of --results, or every op."""
    from harness.changes import Selection, changed_files, select_ops
    if args.op:
        return Selection(tuple(args.op), {op: "named with --op" for op in args.op})
    if results_ops is not None and args.changed_files is None and not args.base:
        ops = [op for op in config_ops if op in results_ops]
        return Selection(tuple(ops), {op: "in the results given" for op in ops})
    if args.changed_files is not None:
        return select_ops(args.changed_files)
    if args.base:
        try:
            return select_ops(changed_files(args.base))
        except ValueError as exc:
            raise GateSetupError(str(exc))
    return Selection(tuple(config_ops), {op: "no change given (--base or --changed-files): every op"
                                         for op in config_ops})


def run_gate(args, plan_check, echo=print) -> int:
    """`python -m harness gate`: 0 when nothing is worse than the baseline, 1 otherwise."""
    from harness.environment import machine, new_run_id
    from harness.run_folder import RunFolderError, prepare
    from harness.registry import OPS
    from reports import read_results
    from reports.compare import compare_runs, compare_verdict, render_compare_markdown, write_compare_html

    directory = args.baseline_dir or BASELINE_DIR
    config = GateConfig.load(directory)
    klass = args.device_class or device_class()
    suite = config.suite(klass)
    settings = config.comparison(args.growth_factor, args.ratio_floor, args.noise_roundings)
    for flag, value in (("--jobs", args.jobs), ("--sweep-jobs", args.sweep_jobs)):
        if value is not None and value < 1:
            raise GateSetupError(f"{flag} must be at least 1")
    from harness.parallel import default_jobs
    jobs = args.jobs or default_jobs()
    if args.update_baseline and args.impl:
        raise GateSetupError("a baseline is written from our kernels; drop --impl with --update-baseline")
    for path in args.results or []:
        if not path.exists():
            raise GateSetupError(f"no results file {path}")
    if args.results:
        from harness.shards import MergeError, check_whole
        try:
            check_whole(args.results)
        except MergeError as exc:
            raise GateSetupError(str(exc))
    given = read_results(args.results) if args.results else None
    selection = _selection(args, list(OPS), None if given is None else set(given["op"]))
    plan_check(selection.ops, args.impl)
    need_baselines = selection.ops and not args.update_baseline
    baselines = baseline_paths(directory, klass, selection.ops) if need_baselines else {}
    try:
        out = prepare(args.out, Path("results") / new_run_id(f"gate-{klass}"), force=args.force)
    except RunFolderError as exc:
        raise GateSetupError(str(exc))
    summary_path = args.summary or out / "gate-summary.md"
    if not selection.ops:
        message = f"**PASS**: nothing to gate: {selection.describe()}.\n"
        summary_path.parent.mkdir(parents=True, exist_ok=True)
        summary_path.write_text(message)
        echo(message)
        return 0
    echo(f"gate on '{klass}': {selection.describe()}", flush=True)
    crashed = []
    if given is not None:
        candidate = given[given["op"].isin(selection.ops)]
    else:
        echo(f"sweeping {len(selection.ops)} op(s), {jobs} at a time, into {out}", flush=True)
        cache_args = ["--no-golden-cache"] if args.no_golden_cache else []
        finished = run_sweeps(selection.ops, suite, out, args.impl, jobs, cache_args, echo, args.sweep_jobs)
        crashed = [(op, code) for op, _, code in finished if code not in (0, 1)]
        candidate = read_results([p for _, p, _ in finished if p.exists()])
    made_on = machine() if given is None else machine_of(candidate)
    if args.update_baseline:
        written = write_baseline(candidate, directory, klass, made_on)
        bad = candidate["verdict"].isin(["FAIL", "ERROR"])
        echo(f"baseline written: {', '.join(map(str, written))} ({len(candidate)} rows, "
             f"{int(bad.sum())} FAIL or ERROR)")
        return 1 if bad.any() or crashed else 0
    table = compare_runs(candidate, read_results(list(baselines.values())), *settings)
    meta = gate_meta(selection, klass, directory, out, crashed, made_on,
                     "this machine" if given is None else "the results' machine")
    markdown = render_compare_markdown(table, meta, incomplete=bool(crashed))
    for folder in (summary_path.parent, out):
        folder.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(markdown)
    write_compare_html(table, out / "compare.html", meta)
    echo(markdown)
    echo(f"summary {summary_path}; comparison page {out / 'compare.html'}")
    return 1 if compare_verdict(table) == "FAIL" or crashed else 0
