"""Command line: `python -m harness sweep|gate|report|repro|bench|list`.

Exit codes: 0 every row passed, 1 a row failed or errored, 2 a usage error (one line, no traceback).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from fla_kernels.utils import interpreting
from harness.cases import (DTYPE_CHOICES, DTYPES, GATES, H0_OPTIONS, PRESETS, VARLEN, Case, default_preset,
                           expand)
from harness.environment import new_run_id
from harness.golden_cache import GoldenCache, default_dir
from harness.registry import OPS, get_op, op_symbols
from harness.run_folder import RunFolderError, prepare
from harness.supervisor import resume_arguments, resume_command, tell_run_folder
from harness import autotune_mode, upstream
from harness.checks import EXTRA_CHECKS
from harness.runner import implementations
from reports.schema import SHAPE


class UsageError(Exception):
    """A mistake in the command line: reported in one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _csv(kind):
    def parse(text):
        items = [item.strip() for item in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"'{text}' has an empty item")
        try:
            return [kind(item) for item in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of {kind.__name__}")
    return parse


BENCH_SHAPE = {"B": 8, "T": 2048, "H": 16, "K": 128, "V": 128}   # bench's default shape


def _own_symbol_note(axis: str) -> str:
    """' (M: slots per head; gsa)' for a symbol some ops declare, '' for a core one."""
    users = [spec.name for spec in OPS.values() if axis in spec.symbols]
    return f" ({axis}: {op_symbols()[axis].meaning}; {', '.join(users)})" if users else ""


def _options_note() -> str:
    """'gsa: g=None; linear_attn: normalize; ...' for the ops that have options."""
    return "; ".join(f"{spec.name}: {', '.join(spec.all_options())}" for spec in OPS.values()
                     if spec.all_options())


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sweep = sub.add_parser("sweep", help="run cases and report every output's and gradient's error")
    sweep.add_argument("--op", type=_csv(str), required=True, help="op(s), comma-separated")
    sweep.add_argument("--dtype", type=_csv(str), default=list(DTYPES),
                       help=f"{','.join(DTYPE_CHOICES)} (default fp32,fp16,bf16; '-fp32gates': float32 "
                            "gates beside 16-bit q, k, v)")
    sweep.add_argument("--variant", type=_csv(str), help="variants to run (default: all of the op)")
    sweep.add_argument("--preset", help=f"case grid: {', '.join(PRESETS)} (default: gpu with CUDA, else cpu)")
    for axis in SHAPE:
        sweep.add_argument(f"--{axis}", type=_csv(int), help=f"override the preset's {axis} values"
                           + _own_symbol_note(axis))
    sweep.add_argument("--h0", type=_csv(str), help=f"initial state: {', '.join(H0_OPTIONS)}")
    sweep.add_argument("--gate", type=_csv(str), help=f"gate strength: {', '.join(GATES)}")
    sweep.add_argument("--varlen", type=_csv(str),
                       help=f"batches: {', '.join(VARLEN)} (packed: the B * T tokens as sequences of "
                            "unequal lengths in one row, cu_seqlens; default none)")
    sweep.add_argument("--option", type=_csv(str),
                       help="the op's options to call it with, or none for its core call (default "
                            f"none): {_options_note()}")
    sweep.add_argument("--seed", type=int, default=0)
    sweep.add_argument("--checks", type=_csv(str),
                       help=f"checks beyond the golden: {','.join(EXTRA_CHECKS)}, or none (default: "
                            "all; determinism is left out for our kernels under the Triton "
                            "interpreter, which runs serially and so cannot show a race)")
    sweep.add_argument("--impl", action="append", default=[], metavar="VARIANT=module:function",
                       help="run an external implementation in place of our VARIANT (repeatable); "
                            "`--impl fla` runs upstream flash-linear-attention's variants instead of "
                            "ours")
    sweep.add_argument("--autotune", choices=autotune_mode.MODES, default="upstream",
                       help="upstream (default): an external implementation's autotuners time every "
                            "config, as its users' do; first: each runs the first config it would "
                            "time, untimed, so a cold sweep compiles a kernel once instead of every "
                            "config (its rows say so)")
    sweep.add_argument("--out", type=Path, help="output folder (default results/<run id>)")
    sweep.add_argument("--golden-cache", type=Path, default=None,
                       help="folder of stored goldens (default $HARNESS_GOLDEN_CACHE or "
                            "~/.cache/fla-harness/goldens)")
    sweep.add_argument("--no-golden-cache", action="store_true", help="compute every golden afresh")
    sweep.add_argument("--resume", action="store_true",
                       help="continue the run in --out: skip the cases its results.csv holds whole")
    sweep.add_argument("--force", action="store_true",
                       help="replace the run already in --out (without it, an existing run is kept)")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep.add_argument("--jobs", type=int,
                       help="worker processes, each seeing one GPU in turn, dealt the cases as they "
                            "free up (default: one per visible GPU, one on a CPU)")
    sweep.add_argument("--shard", metavar="I/N",
                       help="run shard I of N: a deterministic 1/N of the cases, balanced by cost "
                            "(`report` merges the shards' results and checks none is missing); "
                            "I-J/N runs shards I to J in one run")
    _add_gate_parser(sub)
    report = sub.add_parser("report", help="re-render the HTML and markdown of finished results, or "
                                           "compare them with a baseline run")
    report.add_argument("csv", nargs="+", type=Path, help="results CSV(s) of the run")
    report.add_argument("--baseline", nargs="+", type=Path,
                        help="results CSV(s) of the baseline run: write a comparison page instead")
    report.add_argument("--html", type=Path, help="the HTML page (default: report.html or compare.html "
                                                   "beside the first CSV)")
    report.add_argument("--markdown", type=Path, help="also write the markdown summary here")
    report.add_argument("--growth-factor", type=float,
                        help="with --baseline: err/bound growth counted as worse (default: "
                             "baselines/gate.json's)")
    report.add_argument("--ratio-floor", type=float,
                        help="with --baseline: err/bound under which growth is ignored (default: "
                             "baselines/gate.json's)")
    report.add_argument("--noise-roundings", type=float,
                        help="with --baseline: roundings of the golden err may move by between "
                             "machines (default: baselines/gate.json's)")
    repro = sub.add_parser("repro", help="write a standalone script that rebuilds one case's inputs "
                                         "and shows its comparison with the golden")
    repro.add_argument("case_id", help="a case_id column value, e.g. rwkv6-bf16-B1-T65-H2-K16-V16-"
                                       "h0_grad-normal-s0")
    repro.add_argument("--variant", help="the variant to run (default: the op's first)")
    repro.add_argument("--impl", metavar="module:function", help="run this function instead of ours")
    repro.add_argument("--segments", action="store_true",
                       help="reproduce the segments check (T cut in two, the state carried)")
    repro.add_argument("--layer", metavar="SET", help="reproduce the layer check of that implementation "
                       "set's own layer (e.g. fla) in the variant's mode instead of one function")
    repro.add_argument("--out", type=Path, help="script path or folder (default repro_<case_id>.py; with "
                       "--layer repro_<case_id>_<variant>_<set>_layer.py)")
    bench = sub.add_parser("bench", help="time forward and forward+backward of our variants, "
                                         "upstream fla's and the torch reference on one shape")
    bench.add_argument("--op", type=_csv(str), required=True, help="op(s), comma-separated")
    bench.add_argument("--variant", type=_csv(str), help="variants (default: all of the op)")
    bench.add_argument("--dtype", default="bf16", help="fp32, fp16 or bf16 (default bf16)")
    defaults = {**BENCH_SHAPE, **{name: s.bench for name, s in op_symbols().items()}}
    for axis in SHAPE:
        bench.add_argument(f"--{axis}", type=int, default=defaults[axis],
                           help=f"default {defaults[axis]}" + _own_symbol_note(axis))
    bench.add_argument("--impls", type=_csv(str), default=["ours", "fla", "torch"],
                       help="ours, fla, torch (default all three)")
    bench.add_argument("--warm-cache", action="store_true",
                       help="keep Triton's cache (first calls then measure a cache lookup)")
    bench.add_argument("--kernels", action="store_true",
                       help="also profile each candidate's forward+backward pass per kernel "
                            "(kernels.csv, a section of bench.html; needs a GPU)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--out", type=Path, help="output folder (default results/<run id>)")
    sub.add_parser("list", help="show ops, variants and presets")
    return parser


def _add_gate_parser(sub):
    gate = sub.add_parser("gate", help="sweep the ops a change touches and compare them with the "
                                       "committed baseline of this device class")
    which = gate.add_mutually_exclusive_group()
    which.add_argument("--base", help="git revision to diff the working tree against")
    which.add_argument("--changed-files", nargs="*", metavar="PATH", help="the changed files")
    which.add_argument("--op", type=_csv(str), help="gate these ops, whatever changed")
    gate.add_argument("--results", nargs="+", type=Path,
                      help="compare these finished results CSVs instead of sweeping")
    gate.add_argument("--impl", action="append", default=[], metavar="VARIANT=module:function",
                      help="gate an external implementation in place of our VARIANT (repeatable)")
    gate.add_argument("--baseline-dir", type=Path, default=None,
                      help="folder with gate.json and <device class>/<op>.csv (default: baselines/)")
    gate.add_argument("--device-class", help="baseline to compare with (default: cpu under the "
                                             "interpreter, else the GPU model, e.g. h100)")
    gate.add_argument("--growth-factor", type=float,
                      help="fail when a tensor's err/bound grows beyond this factor (default: "
                           "gate.json's)")
    gate.add_argument("--ratio-floor", type=float,
                      help="err/bound under which growth is ignored (default: gate.json's)")
    gate.add_argument("--noise-roundings", type=float,
                      help="roundings of the golden a tensor's err may move by between machines "
                           "on top of the growth factor (default: gate.json's)")
    gate.add_argument("--jobs", type=int,
                      help="sweeps run at once, one process per op, each seeing one GPU in turn "
                           "(default: one per visible GPU, one on a CPU)")
    gate.add_argument("--sweep-jobs", type=int, default=1,
                      help="worker processes each of those sweeps deals its cases to, all on the "
                           "GPU it sees (sweep --jobs): small cases leave a GPU mostly idle, and "
                           "several workers finish a large suite sooner (default 1)")
    gate.add_argument("--out", type=Path, help="output folder (default results/<run id>)")
    gate.add_argument("--force", action="store_true",
                      help="replace an earlier gate run in --out (without it, it is kept)")
    gate.add_argument("--summary", type=Path,
                      help="markdown summary for the pull request (default <out>/gate-summary.md)")
    gate.add_argument("--update-baseline", action="store_true",
                      help="write this run's rows as the device class's baseline")
    gate.add_argument("--no-golden-cache", action="store_true", help="compute every golden afresh")


def _check_choices(name, values, allowed):
    for value in values or []:
        if value not in allowed:
            raise UsageError(f"unknown {name} '{value}'; choose from {', '.join(allowed)}")


def _parse_impls(texts, op_specs) -> tuple[dict, list]:
    """({variant: 'module:function'}, [implementation sets such as 'fla'])."""
    external, sets = {}, []
    for text in texts:
        if text in upstream.SETS:
            why = upstream.available(text)
            if why:
                raise UsageError(f"--impl {text}: {why}")
            sets.append(text)
            continue
        variant, sep, target = text.partition("=")
        if not sep or not variant or target.count(":") != 1 or not all(target.split(":")):
            raise UsageError(f"--impl '{text}' is not of the form VARIANT=module:function")
        if not any(variant in spec.variants for spec in op_specs):
            raise UsageError(f"--impl names variant '{variant}', which the op does not have")
        external[variant] = target
    return external, sets


def _check_options(options, specs):
    """Every option asked for is "none" or an option of one of the ops."""
    known = {name for spec in specs for name in spec.all_options()}
    unknown = [o for o in options or [] if o != "none" and o not in known]
    if unknown:
        ops = " and ".join(spec.name for spec in specs)
        raise UsageError(f"unknown option '{unknown[0]}' of {ops}; known: {', '.join(['none', *sorted(known)])}")


def plan_sweep(args):
    """Validate every argument and build the list of (spec, case, implementations) before running."""
    try:
        specs = [get_op(name) for name in args.op]
    except ValueError as exc:
        raise UsageError(str(exc).rstrip("."))
    _check_choices("dtype", args.dtype, list(DTYPE_CHOICES))
    _check_choices("varlen", args.varlen, list(VARLEN))
    _check_options(args.option, specs)
    _check_choices("initial-state option", args.h0, list(H0_OPTIONS))
    _check_choices("gate", args.gate, list(GATES))
    preset = args.preset or default_preset()
    _check_choices("preset", [preset], list(PRESETS))
    for axis in SHAPE:
        if any(v < 1 for v in getattr(args, axis) or []):
            raise UsageError(f"--{axis} values must be positive integers")
    if args.checks is None:
        args.checks = list(EXTRA_CHECKS)
    elif args.checks != ["none"]:
        _check_choices("check", args.checks, list(EXTRA_CHECKS) + ["none"])
    external, sets = _parse_impls(args.impl, specs)
    note = ""
    if args.autotune == "first":
        if not (external or sets):
            raise UsageError("--autotune first is for an external implementation's autotuners (--impl); "
                             "ours have none")
        autotune_mode.first_config_only()
        note = autotune_mode.NOTE
    overrides = {axis: getattr(args, axis) for axis in SHAPE if axis not in ("K", "V")}
    overrides.update(h0=args.h0, gate=args.gate, varlen=args.varlen, option=args.option)
    if args.K or args.V:
        overrides["KV"] = list(itertools.product(args.K or args.V, args.V or args.K))
    plan = []
    for spec in specs:
        variants = args.variant or list(spec.variants)
        _check_choices(f"variant of {spec.name}", variants, list(spec.variants))
        chosen = {v: t for v, t in external.items() if v in variants}
        releases = {}
        for name in sets:
            theirs = upstream.targets(name, spec.name)
            variants = [v for v in variants if v in theirs]
            chosen.update({v: t for v, t in theirs.items() if v in variants})
            releases.update({v: upstream.release(name) for v in variants})
        if not variants:
            raise UsageError(f"{' and '.join(sets)} has none of the variants asked for of {spec.name}")
        try:
            impls = implementations(spec, variants, chosen, releases, note)
        except ValueError as exc:
            raise UsageError(str(exc).rstrip("."))
        for case in expand(spec, args.dtype, preset, overrides, args.seed):
            plan.append((spec, case, impls))
    return plan, preset


def cmd_list() -> int:
    for spec in OPS.values():
        print(f"{spec.name}: {spec.description}")
        for variant, target in spec.variants.items():
            print(f"  {variant:18s} {target}")
    print("presets:")
    for name, preset in PRESETS.items():
        print(f"  {name:8s} {preset['description']}")
    return 0


@dataclass
class SweepSetup:
    """A sweep's validated plan: its cases, the checks of each (given over the whole plan, so a
    shard's or a worker's case runs those it runs in one whole sweep), the indices this run owes
    (its shard's), and the golden cache."""
    plan: list
    preset: str
    case_checks: list
    indices: list
    shard: tuple | None
    cache: GoldenCache | None


def sweep_setup(args) -> SweepSetup:
    """Everything a sweep (or one of its workers, from the same arguments) needs before a case
    runs; UsageError for any mistake."""
    from harness.checks import checks_per_case
    from harness.shards import parse_shard, shard_indices
    if isinstance(args, list):
        args = build_parser().parse_args(args)
    try:
        shard = parse_shard(args.shard) if args.shard else None
    except ValueError as exc:
        raise UsageError(str(exc))
    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    plan, preset = plan_sweep(args)
    checks = () if args.checks == ["none"] else tuple(args.checks)
    cache = None if args.no_golden_cache else GoldenCache(args.golden_cache or default_dir())
    return SweepSetup(plan, preset, checks_per_case(plan, checks), shard_indices(plan, shard), shard,
                      cache)


def cmd_sweep(args) -> int:
    setup = sweep_setup(args)
    from harness.parallel import WorkersFailed, default_jobs, run_parallel_sweep
    from harness.shards import write_plan
    from harness.sweep import DeviceLost, run_sweep
    from reports import read_results, render_terminal
    label = "-".join(args.op) + "-" + "-".join(args.dtype)
    run_id = new_run_id(label)
    out = _run_folder(args.out, Path("results") / run_id, args.resume, args.force)
    tell_run_folder(out)
    plan, indices, cache = setup.plan, setup.indices, setup.cache
    jobs = min(args.jobs or default_jobs(), max(1, len(indices)))
    shard = f", shard {args.shard}: {len(indices)} of them" if setup.shard else ""
    workers = f", {jobs} workers" if jobs > 1 else ""
    print(f"run {run_id}: {len(plan)} cases ({setup.preset} preset{shard}{workers}) -> {out}", flush=True)
    write_plan(out, plan, indices, setup.shard)
    try:
        if jobs > 1:
            outcome = run_parallel_sweep(args.argv, plan, indices, out, run_id, jobs,
                                         resume=args.resume, progress=not args.quiet)
        else:
            outcome = run_sweep([plan[i] for i in indices], out, run_id, resume=args.resume,
                                progress=not args.quiet, cache=cache,
                                case_checks=[setup.case_checks[i] for i in indices])
    except DeviceLost as lost:
        print(f"{lost}\ngoing on in a new process: the same sweep with --resume --out {out}",
              flush=True)
        restart_sweep(args.argv, out)
    except RunFolderError as exc:  # a results file that cannot be resumed
        raise UsageError(str(exc))
    except WorkersFailed as exc:
        print(f"harness: {exc}", file=sys.stderr)
        return 1
    df = read_results([outcome.csv_path])
    print(render_terminal(df))
    stored = ("" if cache is None or jobs > 1 else   # the workers kept their own counts
              f"; goldens from {cache.directory}: {cache.hits} stored, {cache.misses} computed "
              f"({cache.skipped} faster to compute than to store)")
    print(f"wall time {outcome.wall_s:.1f} s; {outcome.cases_run} cases run, {outcome.cases_skipped} "
          f"resumed{stored}; csv {outcome.csv_path}; html {outcome.html_path}; "
          f"markdown {outcome.markdown_path}")
    if outcome.interrupted:
        left = len(indices) - outcome.cases_run - outcome.cases_skipped
        print(f"interrupted: {left} of {len(indices)} cases not run; continue with\n  "
              f"{resume_command(args.argv, out)}", flush=True)
        return 130
    bad = df["verdict"].isin(["FAIL", "ERROR"]).any()
    return 1 if bad else 0


def whole_sweeps(csv_paths) -> str:
    """UsageError when the results files hold a case twice within one sweep; what they lack of
    the cases their runs owe, as a sentence ("" when nothing; harness.shards)."""
    from harness.shards import MergeError, check_whole
    try:
        return check_whole(csv_paths, partial_ok=True)
    except MergeError as exc:
        raise UsageError(str(exc))


def _run_folder(out, default, resume=False, force=False) -> Path:
    try:
        return prepare(out, default, resume, force)
    except RunFolderError as exc:
        raise UsageError(str(exc))


def cmd_report(args) -> int:
    from reports import read_results, render_markdown, write_html
    from reports.compare import compare_runs, compare_verdict, render_compare_markdown, write_compare_html
    for path in args.csv + (args.baseline or []):
        if not path.exists():
            raise UsageError(f"no results file {path}")
    incomplete = whole_sweeps(args.csv)
    if incomplete:
        warnings.warn(f"the report is of part of the sweep: {incomplete}")
    df = read_results(args.csv)
    if args.baseline:
        from harness.gate import GateConfig
        settings = GateConfig.load().comparison(args.growth_factor, args.ratio_floor,
                                                args.noise_roundings)
        table = compare_runs(df, read_results(args.baseline), *settings)
        meta = {"candidate": ", ".join(map(str, args.csv)), "baseline": ", ".join(map(str, args.baseline))}
        html = args.html or args.csv[0].parent / "compare.html"
        write_compare_html(table, html, meta)
        markdown = render_compare_markdown(table, meta)
        bad = compare_verdict(table) == "FAIL"
    else:
        html = args.html or args.csv[0].parent / "report.html"
        gap = {"incomplete": incomplete} if incomplete else {}
        write_html(df, html, {"sources": ", ".join(map(str, args.csv)), **gap})
        markdown = render_markdown(df, gap or None)
        bad = df["verdict"].isin(["FAIL", "ERROR"]).any() or bool(incomplete)
    if args.markdown:
        args.markdown.write_text(markdown)
    print(markdown)
    print(f"html {html}" + (f"; markdown {args.markdown}" if args.markdown else ""))
    return 1 if bad else 0


def cmd_repro(args) -> int:
    from harness.layer_repro import write_layer_repro
    from harness.repro import write_repro
    if args.layer and (args.impl or args.segments):
        raise UsageError("--layer runs the set's own layer on its own kernels, in one call and through "
                         "its cache: it takes neither --impl nor --segments")
    out = args.out or (Path(".") if args.layer else Path(f"repro_{args.case_id}.py"))
    try:
        if args.layer:
            path = write_layer_repro(args.case_id, out, args.layer, variant=args.variant)
        else:
            path = write_repro(args.case_id, out, variant=args.variant, target=args.impl,
                               segments=args.segments)
    except ValueError as exc:
        raise UsageError(str(exc).rstrip("."))
    print(f"wrote {path}; run it with: python {path}"
          + ("" if args.layer else f"   (python -i {path} keeps the tensors)"))
    return 0


def cmd_gate(args) -> int:
    from harness.gate import GateSetupError, run_gate
    try:
        return run_gate(args, plan_check=_gate_plan_check)
    except GateSetupError as exc:
        raise UsageError(str(exc).rstrip("."))


def _gate_plan_check(ops, impls):
    """Validate ops and --impl values as the sweep would, before any sweep starts."""
    try:
        specs = [get_op(name) for name in ops]
    except ValueError as exc:
        raise UsageError(str(exc).rstrip("."))
    _parse_impls(impls, specs)


def cmd_bench(args) -> int:
    from harness import bench
    try:
        specs = [get_op(name) for name in args.op]
    except ValueError as exc:
        raise UsageError(str(exc).rstrip("."))
    _check_choices("dtype", [args.dtype], list(DTYPES))
    _check_choices("implementation source", args.impls, ["ours", "fla", "torch"])
    for axis in SHAPE:
        if getattr(args, axis) < 1:
            raise UsageError(f"--{axis} must be a positive integer")
    plan = []
    for spec in specs:
        variants = args.variant or list(spec.variants)
        _check_choices(f"variant of {spec.name}", variants, list(spec.variants))
        dims = {axis: getattr(args, axis) if axis in spec.used_symbols() else 0 for axis in SHAPE}
        case = Case(op=spec.name, dtype=args.dtype, h0="none", gate="normal", seed=args.seed, **dims)
        plan.append((spec, case, bench.candidates(spec, variants, args.impls)))
    if interpreting():
        print("note: no GPU; these are the Triton interpreter's times, which say nothing about a GPU's")
    run_id = new_run_id("bench-" + "-".join(args.op))
    out = args.out or Path("results") / run_id
    if not args.warm_cache:
        print(f"Triton cache for first calls: {bench.cold_triton_cache()} (empty)")
    if args.kernels and interpreting():
        print("note: no GPU, so no per-kernel times (the interpreter launches no kernels)")
    csv_path = bench.run_bench(plan, out, run_id, kernels=args.kernels)
    from reports.bench import read_bench, render_bench_markdown, write_bench_html
    from reports.kernels import read_kernels, render_kernels_markdown
    df = read_bench([csv_path])
    kernels = read_kernels(out / "kernels.csv") if args.kernels else None
    html = write_bench_html(df, out / "bench.html", {"run_id": run_id}, kernels)
    print(render_bench_markdown(df) + (render_kernels_markdown(kernels) if args.kernels else ""))
    print(f"csv {csv_path}; html {html}")
    ours_failed = (df["impl"] == "ours") & df["message"].str.startswith("ERROR")
    return 1 if ours_failed.any() else 0


COMMANDS = {"list": lambda args: cmd_list(), "sweep": cmd_sweep, "gate": cmd_gate,
            "report": cmd_report, "repro": cmd_repro, "bench": cmd_bench}


def restart_sweep(argv: list[str], out) -> NoReturn:
    """Replace this process by `python -m harness` with the same arguments, resuming into `out`
    (a fresh process, whose CUDA context works again)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "harness", *resume_arguments(argv, out)])


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the harness's own line (a dropped damaged row, say), not Python's two lines."""
    return f"harness: warning: {message}\n"


def main(argv=None) -> int:
    warnings.formatwarning = _one_line_warning
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file the command reads or writes, never a kernel's (those are rows)
        where = f" {exc.filename}" if exc.filename else ""
        print(f"harness: error:{where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
