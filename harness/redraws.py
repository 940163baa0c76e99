"""More draws of the same-dtype baseline's rounding, for sums whose baseline error rests on few.

A gradient's sum over tokens is compared with the baseline's error of the same sum (metrics.py,
`compare_sums`). Where that error is a handful of numbers (a per-token gradient such as dbeta or
a scalar gate's dg, summed over one chunk, in one or two (batch, head) groups), it is a handful
of draws of a spread, and a lucky one fails a correct kernel: on the H200, our fused_recurrent
gated_delta_rule, fp32, T = 63 and 64, H = 1, failed dg's sum over t at 1.46 and 1.78 x a bound
of three times the baseline's error, where over eight seeds on the CPU the baseline's own error
of that sum spread from 6e-6 to 6e-5 and the kernel's root mean square was 2.1 times the
baseline's. Every token's dg there shares the rounding of the state leaving the chunk, so one
chunk is one draw however many tokens it holds.

A fresh draw of the same arithmetic: the baseline on inputs whose key and value channels are
permuted (the same permutation for every tensor with a K or V axis: inputs, initial states, the
upstream gradients), its results permuted back. The exact results are the same, so the golden
stands for every draw; every sum over K and V runs in another order, so the baseline rounds
afresh, with the same chunks and so the same spread.
"""
from __future__ import annotations

import dataclasses

import torch

from harness.cases import Case
from harness.execution import execute
from harness.goldens import baseline_function
from harness.inputs import CaseInputs
from harness.declaration import OpSpec

DRAWS = 3              # permuted baselines beside the baseline itself
PERMUTED = ("K", "V")  # the channel axes permuted


def _permute(x: torch.Tensor | None, shape: tuple, perms: dict) -> torch.Tensor | None:
    """`x` with each axis whose symbol `perms` names indexed by that permutation."""
    if x is None:
        return None
    for axis, symbol in enumerate(shape):
        if symbol in perms:
            x = x.index_select(axis, perms[symbol].to(x.device))
    return x


def permuted_inputs(spec: OpSpec, inputs: CaseInputs, perms: dict) -> CaseInputs:
    """`inputs` with the channels of every tensor permuted by `perms` (symbol -> index tensor)."""
    states = [s.shape for s in spec.states]
    tensors = {s.name: _permute(inputs.tensors[s.name], s.shape, perms) for s in spec.inputs}
    h0 = inputs.initial_states
    return dataclasses.replace(
        inputs, tensors=tensors, do=_permute(inputs.do, ("B", "T", "H", "V"), perms),
        initial_states=None if h0 is None else tuple(_permute(x, s, perms) for x, s in zip(h0, states)),
        dhts=tuple(_permute(x, s, perms) for x, s in zip(inputs.dhts, states)))


def channel_permutations(inputs: CaseInputs, draw: int) -> dict:
    """Draw `draw`'s permutation of each of PERMUTED (symbol -> index tensor), from a generator
    of its own, so a case's draws are the same in every run."""
    gen = torch.Generator().manual_seed(draw)
    return {symbol: torch.randperm(inputs.dims[symbol], generator=gen) for symbol in PERMUTED}


def baseline_redraws(spec: OpSpec, case: Case, inputs: CaseInputs, draws: int = DRAWS) -> list[dict]:
    """`draws` results of the baseline on channel-permuted `inputs`, each permuted back."""
    shapes = spec.tensor_shapes()
    results = []
    for draw in range(1, draws + 1):
        perms = channel_permutations(inputs, draw)
        inverse = {symbol: torch.argsort(p) for symbol, p in perms.items()}
        out = execute(baseline_function(spec, case), spec, case, permuted_inputs(spec, inputs, perms))
        results.append({name: _permute(x, shapes.get(name, ()), inverse) for name, x in out.items()})
    return results
