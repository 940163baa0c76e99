"""Test set-up: the Triton interpreter without CUDA (set before any kernel is defined)."""
import fla_kernels  # noqa: F401
