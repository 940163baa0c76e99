"""Shared set-up of the harness tests: the rwkv6 spec, a small case, and the planted
implementations of tests/implementations.py as run_case takes them."""
import torch

from harness.cases import Case
from harness.declaration import load_function
from harness.registry import get_op
from harness.runner import Implementation

SPEC = get_op("rwkv6")
CPU = torch.device("cpu")


def impl(name, variant="chunk"):
    return Implementation(variant, f"tests.implementations:{name}",
                          load_function(f"tests.implementations:{name}"))


def case(dtype="fp32", T=40, h0="grad", gate="normal"):
    return Case(op="rwkv6", dtype=dtype, B=2, T=T, H=2, K=8, V=6, h0=h0, gate=gate, seed=1)
