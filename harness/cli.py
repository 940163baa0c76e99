"""Command line: `python -m harness sweep|list`.

Exit codes: 0 every row passed, 1 a row failed or errored, 2 a usage error (one line, no traceback).
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from fla_kernels.utils import interpreting
from harness.cases import DTYPES, GATES, H0_OPTIONS, PRESETS, default_preset, expand
from harness.environment import new_run_id
from harness.golden_cache import GoldenCache, default_dir
from harness.registry import OPS, get_op
from harness.runner import EXTRA_CHECKS, implementations


class UsageError(Exception):
    """A mistake in the command line: reported in one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _csv(kind):
    def parse(text):
        try:
            values = [kind(item) for item in text.split(",") if item.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of {kind.__name__}")
        if not values:
            raise argparse.ArgumentTypeError("an empty list")
        return values
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sweep = sub.add_parser("sweep", help="run cases and report every output's and gradient's error")
    sweep.add_argument("--op", type=_csv(str), required=True, help="op(s), comma-separated")
    sweep.add_argument("--dtype", type=_csv(str), default=list(DTYPES), help="fp32,fp16,bf16")
    sweep.add_argument("--variant", type=_csv(str), help="variants to run (default: all of the op)")
    sweep.add_argument("--preset", help=f"case grid: {', '.join(PRESETS)} (default: gpu with CUDA, else cpu)")
    for axis in ("B", "T", "H", "K", "V", "M"):
        sweep.add_argument(f"--{axis}", type=_csv(int), help=f"override the preset's {axis} values")
    sweep.add_argument("--h0", type=_csv(str), help=f"initial state: {', '.join(H0_OPTIONS)}")
    sweep.add_argument("--gate", type=_csv(str), help=f"gate strength: {', '.join(GATES)}")
    sweep.add_argument("--seed", type=int, default=0)
    sweep.add_argument("--checks", type=_csv(str),
                       help=f"checks beyond the golden: {','.join(EXTRA_CHECKS)}, or none (default: "
                            "all; without determinism under the Triton interpreter, which runs "
                            "serially and so cannot show a race)")
    sweep.add_argument("--impl", action="append", default=[], metavar="VARIANT=module:function",
                       help="run an external implementation in place of our VARIANT (repeatable)")
    sweep.add_argument("--out", type=Path, help="output folder (default results/<run id>)")
    sweep.add_argument("--golden-cache", type=Path, default=None,
                       help="folder of stored goldens (default $HARNESS_GOLDEN_CACHE or "
                            "~/.cache/fla-harness/goldens)")
    sweep.add_argument("--no-golden-cache", action="store_true", help="compute every golden afresh")
    sweep.add_argument("--resume", action="store_true", help="skip cases already in --out's results.csv")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sub.add_parser("list", help="show ops, variants and presets")
    return parser


def _check_choices(name, values, allowed):
    for value in values or []:
        if value not in allowed:
            raise UsageError(f"unknown {name} '{value}'; choose from {', '.join(allowed)}")


def _parse_impls(texts, op_specs) -> dict:
    external = {}
    for text in texts:
        variant, sep, target = text.partition("=")
        if not sep or not variant or target.count(":") != 1 or not all(target.split(":")):
            raise UsageError(f"--impl '{text}' is not of the form VARIANT=module:function")
        if not any(variant in spec.variants for spec in op_specs):
            raise UsageError(f"--impl names variant '{variant}', which the op does not have")
        external[variant] = target
    return external


def plan_sweep(args):
    """Validate every argument and build the list of (spec, case, implementations) before running."""
    try:
        specs = [get_op(name) for name in args.op]
    except ValueError as exc:
        raise UsageError(str(exc).rstrip("."))
    _check_choices("dtype", args.dtype, list(DTYPES))
    _check_choices("initial-state option", args.h0, list(H0_OPTIONS))
    _check_choices("gate", args.gate, list(GATES))
    preset = args.preset or default_preset()
    _check_choices("preset", [preset], list(PRESETS))
    for axis in ("B", "T", "H", "K", "V", "M"):
        if any(v < 1 for v in getattr(args, axis) or []):
            raise UsageError(f"--{axis} values must be positive integers")
    if args.checks is None:
        args.checks = [c for c in EXTRA_CHECKS if not (c == "determinism" and interpreting())]
    elif args.checks != ["none"]:
        _check_choices("check", args.checks, list(EXTRA_CHECKS) + ["none"])
    external = _parse_impls(args.impl, specs)
    overrides = {"B": args.B, "T": args.T, "H": args.H, "h0": args.h0, "gate": args.gate, "M": args.M}
    if args.K or args.V:
        overrides["KV"] = list(itertools.product(args.K or args.V, args.V or args.K))
    plan = []
    for spec in specs:
        variants = args.variant or list(spec.variants)
        _check_choices(f"variant of {spec.name}", variants, list(spec.variants))
        try:
            impls = implementations(spec, variants, {v: t for v, t in external.items() if v in variants})
        except ValueError as exc:
            raise UsageError(str(exc).rstrip("."))
        for case in expand(spec.name, args.dtype, preset, overrides, args.seed, spec.uses_slots):
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


def cmd_sweep(args) -> int:
    plan, preset = plan_sweep(args)
    from harness.sweep import run_sweep
    from reports import read_results, render_terminal
    label = "-".join(args.op) + "-" + "-".join(args.dtype)
    run_id = new_run_id(label)
    out = args.out or Path("results") / run_id
    print(f"run {run_id}: {len(plan)} cases ({preset} preset) -> {out}", flush=True)
    checks = () if args.checks == ["none"] else tuple(args.checks)
    cache = None if args.no_golden_cache else GoldenCache(args.golden_cache or default_dir())
    outcome = run_sweep(plan, out, run_id, resume=args.resume, progress=not args.quiet, checks=checks,
                        cache=cache)
    df = read_results([outcome.csv_path])
    print(render_terminal(df))
    stored = ("" if cache is None else
              f"; goldens from {cache.directory}: {cache.hits} stored, {cache.misses} computed")
    print(f"wall time {outcome.wall_s:.1f} s; {outcome.cases_run} cases run, {outcome.cases_skipped} "
          f"resumed{stored}; csv {outcome.csv_path}; html {outcome.html_path}; "
          f"markdown {outcome.markdown_path}")
    bad = df["verdict"].isin(["FAIL", "ERROR"]).any()
    return 1 if bad else 0


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "list":
            return cmd_list()
        return cmd_sweep(args)
    except UsageError as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return 2
