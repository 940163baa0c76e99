"""The kernels' precision policy: which products take which operands, and what a kernel stores.

On a GPU, products of 16-bit inputs run on the tensor cores with operands of the inputs' dtype (or
rounded tf32 ones, where a kernel asks), fp32 inputs take exact IEEE products, and outputs are
stored in their own dtype. Under the interpreter, whose bf16 arithmetic, bf16 products and
rounding stores are wrong, every product is IEEE fp32 and kernels store fp32 for torch to round,
unless it emulates the tensor cores' operand rounding (`emulating_tensor_cores`). The kernels'
own exceptions (split products where a gate gradient's two sides must cancel, tf32 for products
of a dot's result) are documented where they are made; `ops/common/dot.py` holds the products.
"""
from __future__ import annotations

import os

import torch
import triton.language as tl

from fla_kernels.utils import interpreting

TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def product_settings(dtype: torch.dtype, tf32: bool = False) -> dict:
    """The FP32_DOT and OPERAND_DTYPE constexprs of `mma` for inputs of `dtype`: IEEE fp32
    products where `dots_in_fp32` says so, else tensor-core operands of the inputs' own dtype or,
    with tf32, rounded tf32 ones."""
    return dict(FP32_DOT=dots_in_fp32(dtype), OPERAND_DTYPE=tl.float32 if tf32 else TL_DTYPES[dtype])


def interpreter_numerics() -> bool:
    """Whether kernels must avoid what the interpreter gets wrong (bf16 math, rounding stores).

    The same as `interpreting()`; kept apart so the compile check can record the specialisations
    a GPU would compile while running under the interpreter.
    """
    return interpreting()


def emulating_tensor_cores() -> bool:
    """Whether the interpreter stands in for the tensor cores (FLA_EMULATE_TENSOR_CORES=1).

    The interpreter's own bf16 products are wrong, so by default every product there is IEEE
    fp32, and a CPU run never sees the rounding of 16-bit and tf32 operands. With this set, `mma`
    rounds its operands to nearest in fp32 arithmetic first, as the tensor cores read them: the
    residues that rounding leaves (a gate gradient whose two sides no longer cancel) show on CPU.
    """
    return interpreting() and os.environ.get("FLA_EMULATE_TENSOR_CORES", "0") == "1"


def dots_in_fp32(dtype: torch.dtype) -> bool:
    """Whether matrix products take fp32 operands (exact IEEE) rather than `dtype` operands.

    fp32 inputs always do; so does everything under the interpreter, whose bf16 arithmetic and
    bf16 `tl.dot` are wrong, unless it emulates the tensor cores' operand rounding.
    """
    return dtype == torch.float32 or (interpreter_numerics() and not emulating_tensor_cores())


def store_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel should write a `dtype` output in before torch casts it.

    Under the interpreter fp32 -> bf16/fp16 stores truncate instead of rounding to nearest, which
    doubles the error; there kernels write fp32 and torch rounds. On a GPU: `dtype` itself.
    """
    return torch.float32 if interpreter_numerics() else dtype
