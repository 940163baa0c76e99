"""A toy op declared in one place, to show that a declaration is all the harness needs: linear
attention with a constant decay, S_t = exp(GAMMA) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.

Its kernels are our simple GLA kernels with every gate set to GAMMA (exact in every dtype), its
definition a float64 loop written out here, its chunked form simple GLA's. The registry takes it
from `OP` when this module is named in FLA_HARNESS_DECLARATIONS (tests/test_toy_op.py).
"""
from __future__ import annotations

import os
import signal
import time

import torch

from fla_kernels.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
from harness.declaration import QKV, OpSpec, OptionSpec
from references.simple_gla import simple_gla_chunked

GAMMA = -0.125   # the log decay of every step: a power of two, so no dtype rounds it

OP = OpSpec(
    name="toy_decay",
    description="S_t = exp(-1/8) S_{t-1} + k_t^T v_t; o_t = scale q_t S_t",
    inputs=QKV,
    variants={"chunk": "tests.toy_op:chunk_toy_decay",
              "fused_recurrent": "tests.toy_op:fused_recurrent_toy_decay"},
    reference_loop="tests.toy_op:toy_decay_recurrent",
    reference_chunked="tests.toy_op:toy_decay_chunked",
    # an option the toy op's calls take as a keyword: the decay of every step doubled
    options={"faster": OptionSpec("the log decay doubled", kwargs={"decay_scale": 2.0})},
)


def _with_constant_gate(fn, gamma=GAMMA):
    """fn(q, k, v, g, ...) as the toy op's fn(q, k, v, ...), g = gamma everywhere."""
    def call(q, k, v, scale=None, initial_state=None, output_final_state=False, decay_scale=1.0,
             **options):
        g = torch.full(q.shape[:3], gamma * decay_scale, dtype=q.dtype, device=q.device)
        return fn(q, k, v, g, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state, **options)
    call.__name__ = f"{fn.__name__}_with_constant_gate"
    return call


chunk_toy_decay = _with_constant_gate(chunk_simple_gla)
fused_recurrent_toy_decay = _with_constant_gate(fused_recurrent_simple_gla)
toy_decay_chunked = _with_constant_gate(simple_gla_chunked)
# a planted bug: the decay of a step that is 2^-12 too weak, the size of a bf16 rounding of GAMMA
chunk_toy_decay_wrong_gamma = _with_constant_gate(chunk_simple_gla, GAMMA * (1 - 2.0 ** -8))


def chunk_toy_decay_without_options(q, k, v, scale=None, initial_state=None, output_final_state=False):
    """The chunk kernel as a library that has no options would ship it."""
    return chunk_toy_decay(q, k, v, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state)


def _dying_at(T: int, die, name: str):
    """The chunk kernel, except that a call with T tokens ends the process by `die()` (as a
    compiler's assertion or a driver's fault does) instead of returning."""
    def call(q, k, v, **kwargs):
        if q.shape[1] == T:
            die()
        return chunk_toy_decay(q, k, v, **kwargs)
    call.__name__ = name
    return call


chunk_toy_decay_aborting_at_T20 = _dying_at(20, os.abort, "chunk_toy_decay_aborting_at_T20")
chunk_toy_decay_segfaulting_at_T20 = _dying_at(
    20, lambda: os.kill(os.getpid(), signal.SIGSEGV), "chunk_toy_decay_segfaulting_at_T20")
chunk_toy_decay_exiting_at_T20 = _dying_at(20, lambda: os._exit(0), "chunk_toy_decay_exiting_at_T20")
# stays in its case until killed from outside (the machine ending the whole process tree)
chunk_toy_decay_hanging_at_T20 = _dying_at(20, lambda: time.sleep(600), "chunk_toy_decay_hanging_at_T20")


def _deaf_while_told():
    """With TOY_DEAF set (to a file's path), stays in the case deaf to SIGINT and SIGTERM, as a
    process inside a long compile is, and writes that file once deaf (a stop sent before then
    would be heard); without it, returns (the case only needed more time)."""
    if os.environ.get("TOY_DEAF"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        with open(os.environ["TOY_DEAF"], "w") as deaf:
            deaf.write("deaf\n")
        time.sleep(600)


chunk_toy_decay_deaf_at_T20 = _dying_at(20, _deaf_while_told, "chunk_toy_decay_deaf_at_T20")


def _out_of_memory():
    """Raises as torch does when the device's memory runs out."""
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB (a toy's)")


def _out_of_memory_once():
    """`_out_of_memory` in the first TOY_OOM_CALLS calls (default 1), as memory that workers beside
    it held: each adds a line to the file TOY_OOM_ONCE names."""
    with open(os.environ["TOY_OOM_ONCE"], "a+") as calls:
        calls.seek(0)
        if len(calls.readlines()) < int(os.environ.get("TOY_OOM_CALLS", "1")):
            calls.write("out of memory\n")
            calls.flush()
            _out_of_memory()


chunk_toy_decay_out_of_memory_once_at_T20 = _dying_at(20, _out_of_memory_once,
                                                      "chunk_toy_decay_out_of_memory_once_at_T20")
chunk_toy_decay_out_of_memory_at_T20 = _dying_at(20, _out_of_memory, "chunk_toy_decay_out_of_memory_at_T20")


def chunk_toy_decay_out_of_memory_once_at_T20_slow_at_T40(q, k, v, **kwargs):
    """chunk_toy_decay_out_of_memory_once_at_T20, whose calls at T = 40 take 2 s more; each call at
    T = 20 or 40 adds "T <tokens> <start> <end>" (time.time()) to the file TOY_CALLS names."""
    start = time.time()
    try:
        if q.shape[1] == 40:
            time.sleep(2)
        return chunk_toy_decay_out_of_memory_once_at_T20(q, k, v, **kwargs)
    finally:
        if q.shape[1] in (20, 40):
            with open(os.environ["TOY_CALLS"], "a") as calls:
                calls.write(f"T {q.shape[1]} {start} {time.time()}\n")


def toy_decay_recurrent(q, k, v, scale=None, initial_state=None, output_final_state=False,
                        decay_scale=1.0):
    """The definition, step by step (float64 in, float64 out)."""
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state
    decay = torch.exp(torch.tensor(GAMMA * decay_scale, dtype=q.dtype))
    outputs = []
    for t in range(T):
        S = decay * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(outputs, dim=1), (S if output_final_state else None)
