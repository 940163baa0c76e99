"""Triton building blocks shared by the op families."""
from fla_kernels.ops.common.gate_grad import chunk_gate_grad

__all__ = ["chunk_gate_grad"]
