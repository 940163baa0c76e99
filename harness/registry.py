"""The op registry: every op's declaration, found where it lives.

An op is declared once, by an `OP = OpSpec(...)` in `fla_kernels/ops/<op>/declaration.py`
(harness/declaration.py); the registry imports every such module. Ops declared elsewhere (an
out-of-tree kernel package, a test's toy op) join through the environment variable
FLA_HARNESS_DECLARATIONS, a comma-separated list of modules each defining `OP`; sweeps run in
subprocesses inherit it.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import pkgutil

from harness.declaration import OpSpec

PACKAGE = "fla_kernels.ops"
EXTRA_DECLARATIONS = "FLA_HARNESS_DECLARATIONS"


def declaration_modules() -> list:
    """The modules that declare ops: each op folder's `declaration`, then the extra ones."""
    package = importlib.import_module(PACKAGE)
    found = [f"{PACKAGE}.{m.name}.declaration" for m in pkgutil.iter_modules(package.__path__)
             if m.ispkg and importlib.util.find_spec(f"{PACKAGE}.{m.name}.declaration") is not None]
    extra = [m.strip() for m in os.environ.get(EXTRA_DECLARATIONS, "").split(",") if m.strip()]
    return found + extra


def load_declarations(modules) -> dict:
    """{op name: OpSpec} of `modules`; ValueError in one sentence for a module that declares
    none, or a name declared twice."""
    ops = {}
    for module_name in modules:
        try:
            spec = importlib.import_module(module_name).OP
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"op declaration module '{module_name}' does not give an OP: {exc}") from None
        if spec.name in ops:
            raise ValueError(f"op '{spec.name}' is declared twice ({ops[spec.name].declared_in} and "
                             f"{module_name}).")
        ops[spec.name] = dataclasses.replace(spec, declared_in=module_name)
    return ops


OPS = load_declarations(declaration_modules())


def get_op(name: str) -> OpSpec:
    if name not in OPS:
        raise ValueError(f"unknown op '{name}'; known ops: {', '.join(sorted(OPS))}.")
    return OPS[name]


def op_symbols() -> dict:
    """{symbol: Symbol} of every op's own shape symbols (beyond CORE_SYMBOLS), first declaration
    of each."""
    found = {}
    for spec in OPS.values():
        for name, symbol in spec.symbols.items():
            found.setdefault(name, symbol)
    return found
