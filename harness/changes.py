"""Which ops a change touches: the gate sweeps only those.

A file under `fla_kernels/` or `references/` selects the ops whose code runs it, read from the
static import graph of those two packages (`op_code`); a module no op reaches selects none, and a
path there that is no module of this checkout (deleted, not Python) selects every op. Anything the
numbers of every op depend on (the harness, the tolerance table, the package set-up) selects every
op. Files that cannot change a number (documentation, tests, benchmarks, report rendering, CI
files) select none. A path no rule knows selects every op: the gate errs towards running too much,
never too little.
"""
from __future__ import annotations

import ast
import fnmatch
import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.checks.layer import layer_class
from harness.registry import OPS

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fla_kernels", "references")   # the code whose import graph decides

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


@dataclass(frozen=True)
class Module:
    path: str             # relative to the repository root, e.g. "fla_kernels/ops/gla/chunk.py"
    imports: frozenset    # the modules of the graph it imports by name


@functools.lru_cache(maxsize=None)
def import_graph(root: Path = ROOT) -> dict:
    """Dotted module name -> Module, for every .py file under PACKAGES in the checkout at `root`.

    `import a.b` and `from a import b` where b is a submodule import a.b; `from a import name`
    where name is an attribute imports a (its __init__.py). Relative imports resolve against the
    module's package; imports inside functions count too (they may run)."""
    files = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            files[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return {name: Module(path.relative_to(root).as_posix(),
                         frozenset(_imports(name, is_package, path.read_text(), files)))
            for name, (path, is_package) in files.items()}


def _imports(name: str, is_package: bool, source: str, known) -> set:
    """The modules of `known` that `source`, the text of module `name`, imports."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a file that does not parse may import anything
        return set(known)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                keep = len(package) - node.level + 1
                if keep < 1:
                    continue
                base = ".".join(package[:keep] + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in known else base)
    return found & known.keys()


def _runs_on_import(entries, graph) -> set:
    """The modules importing `entries` runs: those reached through explicit imports, and the
    parent packages of each. A parent's __init__.py runs, but its own imports are followed only
    where the package is imported explicitly: `fla_kernels/__init__.py` re-exports every op, and
    following it would make every op depend on every other op's kernels."""
    reached, todo = set(), [m for m in entries if m in graph]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += graph[module].imports
    parents = {module.rsplit(".", i)[0] for module in reached for i in range(1, module.count(".") + 1)}
    return reached | (parents & graph.keys())


def entry_modules(op: str) -> dict:
    """What of the op the gate runs -> its modules: the variants' kernels, the float64 references,
    the layer and the op's declaration."""
    spec = OPS[op]
    return {"kernels": {target.split(":")[0] for target in spec.variants.values()},
            "references": {target.split(":")[0] for target in (spec.reference_loop, spec.reference_chunked)},
            "layer": set() if spec.layer is None else {layer_class(spec).__module__},
            "declaration": {spec.declared_in}}


@functools.lru_cache(maxsize=None)
def op_code(root: Path = ROOT) -> dict:
    """op -> {path of each file its code runs: why a change there selects the op}."""
    graph = import_graph(root)
    code = {}
    for op in OPS:
        reasons = code[op] = {}
        for what, entries in entry_modules(op).items():
            verb = "import" if what in ("kernels", "references") else "imports"
            for module in sorted(_runs_on_import(entries, graph)):
                path = graph[module].path
                reasons.setdefault(path, f"its {what} changed ({path})" if module in entries
                                   else f"its {what} {verb} {path}")
    return code


def ops_for_path(path: str, root: Path = ROOT) -> tuple[dict, str]:
    """({op: why} for the ops a change to `path` selects, in registry order; why it selects none,
    or ""), `path` relative to the repository root."""
    path = Path(path).as_posix()
    top = path.split("/")[0]
    if top == "harness":
        what = "the tolerance table" if path.endswith("tolerance.py") else "the harness"
        return dict.fromkeys(OPS, f"{what} changed ({path})"), ""
    if top in PACKAGES:
        if path not in {module.path for module in import_graph(root).values()}:
            return dict.fromkeys(OPS, f"{path} changed and is no module of this checkout "
                                      "(deleted, or not Python)"), ""
        selected = {op: code[path] for op, code in op_code(root).items() if path in code}
        return selected, "" if selected else f"no op's code imports it ({path})"
    for pattern, why in NO_NUMBERS:
        if fnmatch.fnmatch(path, pattern):
            return {}, why
    if path in ("pyproject.toml", "tox.ini", "setup.py", "setup.cfg"):
        return dict.fromkeys(OPS, f"the package set-up changed ({path})"), ""
    return dict.fromkeys(OPS, f"a file no rule knows changed ({path})"), ""


def select_ops(paths, root: Path = ROOT) -> Selection:
    reasons = {}
    for path in paths:
        for op, why in ops_for_path(path, root)[0].items():
            reasons.setdefault(op, why)
    return Selection(tuple(op for op in OPS if op in reasons), reasons)


def changed_files(base: str, repo: Path | None = None) -> list[str]:
    """Files that differ between `base` and the working tree (committed or not), from git.
    Raises ValueError in one sentence when git cannot answer."""
    root = repo or ROOT
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
