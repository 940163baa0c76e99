"""Matrix product whose operand precision is chosen at compile time."""
import triton
import triton.language as tl


@triton.jit
def mma(a, b, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """a @ b accumulated in fp32.

    FP32_DOT: operands in fp32 with exact IEEE products (fp32 inputs, and the
    interpreter, whose bf16 products are wrong); otherwise operands are rounded
    to OPERAND_DTYPE (the inputs' bf16 / fp16) for the tensor cores.
    """
    if FP32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a.to(OPERAND_DTYPE), b.to(OPERAND_DTYPE), out_dtype=tl.float32)
