"""Computed tensor-core operands stored in half the bytes, as the tf32 products read them.

A tf32 value has 11 significant bits, as many as fp16. A tile rounded to tf32 (`round_tf32`, as
`mma` rounds a float32 operand) and divided by a power of two s that brings its largest magnitude
into [2^14, 2^15) is therefore exact in fp16, down to 2^-28 of that largest magnitude (fp16's
normal range); s, one float32 per tile, is stored beside it. The reader multiplies the fp16 tile
by s (`tile_scale`; `column_scales` for a row of tiles) and has the very operand its tf32 product
takes, from 2 bytes an element instead of 4. Elements below 2^-28 of their tile's largest lose
bits to fp16's subnormals: at most one subnormal step, 2^-38 of that largest, where the product
rounds the largest itself by 2^-12.

The same tiles feed fp16 products (`mma_fp16`): a product of two such tiles, times their scales,
is the tf32 product of the values they hold, at twice the tensor cores' tf32 rate and from half
the shared memory.
"""
import triton
import triton.language as tl

from fla_kernels.ops.common.dot import mma, round_tf32, tf32_parts
from fla_kernels.ops.common.tiles import store_rows


@triton.jit
def _power_of_two(e):
    """2^e as float32, for integer e in [-126, 127]."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def tf32_scaled(val):
    """(round_tf32(val) / s, s) for a float32 tile val: s = 2^(e - 14), e the exponent of its
    largest magnitude, clamped so that s and 1 / s are normal float32 (a tile of zeros, or of
    float32 subnormals, takes 2^-126, and one holding an Inf keeps it)."""
    v = round_tf32(val)
    amax = tl.max(tl.max(tl.abs(v), axis=1), axis=0)
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.minimum(tl.maximum(e, -112), 127)
    return v * _power_of_two(14 - e), _power_of_two(e - 14)


@triton.jit
def fp16_operand(val):
    """(tile, s): `tf32_scaled` of the float32 tile val in fp16, where it is exact."""
    v, s = tf32_scaled(val)
    return v.to(tl.float16), s


@triton.jit
def mma_fp16(a16, b, FP32_DOT: tl.constexpr):
    """a16 @ b for a16 an fp16 tile and b float32, on fp16 tensor cores: b as `fp16_operand`,
    the product times its scale. The tf32 product of a16 with b (`mma`) to the number, but for
    b's elements below 2^-28 of its largest."""
    b16, s = fp16_operand(b)
    return mma(a16, b16, FP32_DOT, tl.float16) * s


@triton.jit
def mma_fp16_split_rhs(a16, b, FP32_DOT: tl.constexpr):
    """`mma_tf32_split_rhs` of an fp16 tile a16 on fp16 tensor cores (`mma_fp16` of b's two tf32
    parts), the same numbers."""
    hi, lo = tf32_parts(b)
    return mma_fp16(a16, hi, FP32_DOT) + mma_fp16(a16, lo, FP32_DOT)


@triton.jit
def store_tf32_tile(x, scales, s_idx, val, base, t0, T, H: tl.constexpr, D: tl.constexpr,
                    BR: tl.constexpr, BD: tl.constexpr, i_d):
    """Store the tile val [BR, BD] (float32) into x [B, T, H, D] (fp16) at rows t0.., columns
    i_d*BD.., as `tf32_scaled`, and its scale into scales[s_idx]."""
    v, s = tf32_scaled(val)
    store_rows(x, v, base, t0, T, H, D, BR, BD, i_d)
    tl.store(scales + s_idx, s)


@triton.jit
def tile_scale(scales, s_idx):
    """The scale of the fp16 tile whose scale `tf32_scaled` gave and scales[s_idx] holds: the
    tile times it is the tf32 operand."""
    return tl.load(scales + s_idx)


@triton.jit
def column_scales(scales, s_idx, D: tl.constexpr, BD: tl.constexpr, BS: tl.constexpr):
    """[BD] float32: the scale of each column of a row tile of all D columns (BD >= D) whose
    blocks of BS columns `store_tf32_tile` stored with scales[s_idx], scales[s_idx + 1], ...
    (zero past D)."""
    d = tl.arange(0, BD)
    s = tl.zeros([BD], dtype=tl.float32)
    for j in tl.static_range((BD + BS - 1) // BS):
        if j * BS < D:
            s = tl.where(d // BS == j, tl.load(scales + s_idx + j), s)
    return s
