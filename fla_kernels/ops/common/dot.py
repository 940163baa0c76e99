"""Matrix products whose operand precision is chosen at compile time (`fla_kernels.precision`)."""
import triton
import triton.language as tl

from fla_kernels.precision import emulating_tensor_cores

# the interpreter rounds 16-bit and tf32 operands as the tensor cores do (`emulating_tensor_cores`)
EMULATE = tl.constexpr(emulating_tensor_cores())


@triton.jit
def mma(a, b, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """a @ b accumulated in fp32.

    FP32_DOT: operands in fp32 with exact IEEE products (fp32 inputs, and the
    interpreter, whose bf16 products are wrong); otherwise operands are rounded
    to OPERAND_DTYPE for the tensor cores: the inputs' bf16 / fp16, or float32 for
    tf32 products (bf16 and fp16 values are exact in tf32; computed operands keep
    10 bits).
    """
    if FP32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif EMULATE:
        return tl.dot(rounded_like(a, OPERAND_DTYPE), rounded_like(b, OPERAND_DTYPE),
                      input_precision="ieee")
    elif OPERAND_DTYPE == tl.float32:
        return tl.dot(round_tf32(a), round_tf32(b), input_precision="tf32")
    else:
        return tl.dot(a.to(OPERAND_DTYPE), b.to(OPERAND_DTYPE), out_dtype=tl.float32)


@triton.jit
def round_tf32(x):
    """x as float32 rounded to the nearest tf32 value (10 mantissa bits, ties away from zero).

    The tensor cores read a tf32 operand by dropping its low 13 bits: truncation, which biases
    every product of a computed operand (k * exp(suffix) into a state carried over thousands of
    steps drifted 3x further than rounding to fp16 does). Rounded first, the bias is gone; bf16
    and fp16 values pass unchanged.
    """
    bits = x.to(tl.float32).to(tl.int32, bitcast=True)
    return ((bits + 0x1000) & -0x2000).to(tl.float32, bitcast=True)


@triton.jit
def tf32_operand(x, FP32_DOT: tl.constexpr):
    """x as a tf32 product will read it (`round_tf32`), for a sum formed elsewhere from the same
    value that must see the same number (a gate gradient's row and column terms); unchanged
    float32 for IEEE products (FP32_DOT)."""
    if FP32_DOT:
        return x.to(tl.float32)
    else:
        return round_tf32(x)


@triton.jit
def _round_mantissa(x, DROP: tl.constexpr):
    """x (fp32) rounded to nearest, ties to even, with the low DROP bits of its mantissa cleared."""
    bits = x.to(tl.float32).to(tl.int32, bitcast=True)
    odd = (bits >> DROP) & 1
    return ((bits + ((1 << (DROP - 1)) - 1) + odd) & -(1 << DROP)).to(tl.float32, bitcast=True)


@triton.jit
def rounded_like(x, OPERAND_DTYPE: tl.constexpr):
    """x as the tensor cores read it with OPERAND_DTYPE operands, in fp32 arithmetic (the
    interpreter's own bf16 conversions truncate): bf16 keeps 7 mantissa bits, fp16 10 (its range
    is not modelled), tf32 operands are rounded first (`round_tf32`)."""
    if OPERAND_DTYPE == tl.bfloat16:
        return _round_mantissa(x, 16)
    elif OPERAND_DTYPE == tl.float16:
        return _round_mantissa(x, 13)
    else:
        return round_tf32(x)


@triton.jit
def _split(x):
    """x (fp32) as hi + lo, both bf16: hi carries 8 bits of mantissa, lo the next 8."""
    x = x.to(tl.float32)
    hi = x.to(tl.bfloat16)
    return hi, (x - hi.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def mma_split(a, b, FP32_DOT: tl.constexpr):
    """a @ b to about 16 bits on the tensor cores: hi*hi + hi*lo + lo*hi of bf16 splits.

    For products whose sums later cancel against sums formed elsewhere (the q dq - k dk of a
    gate gradient): one bf16 rounding of either operand leaves a residue that does not cancel
    and, summed over a chunk, biases the gate gradient the same way at every token. bf16 for
    every input dtype, so fp16 inputs cannot overflow the split. FP32_DOT: one IEEE product.
    """
    if FP32_DOT:
        return mma(a, b, FP32_DOT, tl.float32)
    elif EMULATE:
        a_hi, b_hi = _round_mantissa(a, 16), _round_mantissa(b, 16)
        a_lo, b_lo = _round_mantissa(a - a_hi, 16), _round_mantissa(b - b_hi, 16)
        acc = tl.dot(a_hi, b_lo, input_precision="ieee")
        acc += tl.dot(a_lo, b_hi, input_precision="ieee")
        return acc + tl.dot(a_hi, b_hi, input_precision="ieee")
    else:
        a_hi, a_lo = _split(a)
        b_hi, b_lo = _split(b)
        acc = tl.dot(a_hi, b_lo, out_dtype=tl.float32)
        acc = tl.dot(a_lo, b_hi, acc, out_dtype=tl.float32)
        return tl.dot(a_hi, b_hi, acc, out_dtype=tl.float32)


@triton.jit
def tf32_parts(x):
    """x (fp32) as hi + lo, both rounded tf32 values (`round_tf32`): hi carries 11 bits of
    mantissa, lo about the next 11."""
    hi = round_tf32(x)
    return hi, round_tf32(x.to(tl.float32) - hi)


@triton.jit
def mma_tf32_split(a, b, FP32_DOT: tl.constexpr):
    """a @ b to about 21 bits in two tf32 products, for b exact in tf32 (a 16-bit input) and a
    computed in fp32: a as two rounded tf32 parts, hi + lo.

    Where a is a dot's result in the same kernel, `mma_split`'s bf16 operands are not safe: the
    H100 (triton 3.6) miscompiled bf16 products of a dot's result when the K loop ran once and
    the V-block was <= 32 wide (`simple_gla/chunk.py`), and tf32 ones were right. FP32_DOT: one
    IEEE product."""
    if FP32_DOT:
        return mma(a, b, FP32_DOT, tl.float32)
    else:
        hi, lo = tf32_parts(a)
        return mma(hi, b, FP32_DOT, tl.float32) + mma(lo, b, FP32_DOT, tl.float32)


@triton.jit
def mma_tf32_split_rhs(a, b, FP32_DOT: tl.constexpr):
    """a @ b to about 21 bits in two tf32 products, for a exact in tf32 (a 16-bit input) and b
    computed in fp32 (a state's gradient): b as two rounded tf32 parts, hi + lo.

    One 16-bit rounding of a state gradient dh is shared by every row j of k_j dh (or v_j dh^T):
    where those rows' keys share a sign (positive feature maps), its error adds up over the
    chunk's tokens instead of averaging out. FP32_DOT: one IEEE product."""
    if FP32_DOT:
        return mma(a, b, FP32_DOT, tl.float32)
    else:
        hi, lo = tf32_parts(b)
        return mma(a, hi, FP32_DOT, tl.float32) + mma(a, lo, FP32_DOT, tl.float32)


@triton.jit
def mma_tf32x3(a, b, FP32_DOT: tl.constexpr):
    """a @ b to about 21 bits in three tf32 products, for a and b both computed in fp32: each as
    two rounded tf32 parts, hi + lo, summed hi*lo + lo*hi + hi*hi (lo*lo, 2^-22 of the product,
    left out).

    For the products a 16-bit kernel needs near fp32 (a triangular solve's gradient, whose
    entries grow along a chunk) without IEEE products on the CUDA cores: at 64 x 64 x 64 those
    took a third of kda's chunk-gradient kernel on an H200 (benchmarks/tuning.md). FP32_DOT: one
    IEEE product."""
    if FP32_DOT:
        return mma(a, b, FP32_DOT, tl.float32)
    else:
        a_hi, a_lo = tf32_parts(a)
        b_hi, b_lo = tf32_parts(b)
        acc = mma(a_hi, b_lo, FP32_DOT, tl.float32) + mma(a_lo, b_hi, FP32_DOT, tl.float32)
        return acc + mma(a_hi, b_hi, FP32_DOT, tl.float32)


@triton.jit
def add_rounded(acc, x):
    """acc + x in fp32 rounded to nearest, where x is a product (`mma`) and acc a carried state.

    Triton folds `acc + tl.dot(a, b)` into a dot that accumulates into acc, and the tensor cores
    add with truncation, not rounding: a state carried through N chunks then drifts by up to an
    ulp per chunk, always the same way (linear attention, bf16, T = 43884: final state off by
    400 fp32 floors). The fma is a plain IEEE add the fold does not match.
    """
    return tl.fma(x, 1.0, acc)
