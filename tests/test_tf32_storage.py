"""tf32 operands stored in fp16 with a power-of-two scale per tile (ops/common/tf32_storage.py):
read back, they are the tf32 values a product takes, bit for bit; tested both ways, against stores
that overflow fp16 or skip the tf32 rounding."""
import fla_kernels  # noqa: F401  (sets the interpreter up before triton is imported)
import pytest
import torch
import triton
import triton.language as tl

from fla_kernels.ops.common import tf32_storage
from fla_kernels.ops.common.dot import round_tf32
from fla_kernels.ops.common.tiles import load_rows, store_rows
from tests.kernel_testing import DEVICE

ROWS, COLUMNS, BLOCK = 16, 64, 32   # a tile of two blocks of 32 columns, a scale each


@triton.jit
def _overflowing_store(x, scales, s_idx, val, base, t0, T, H: tl.constexpr, D: tl.constexpr,
                       BR: tl.constexpr, BD: tl.constexpr, i_d):
    """A planted `store_tf32_tile` whose scale is two powers of two too small: the largest
    magnitude lands in [2^16, 2^17), past fp16's largest finite value."""
    v = round_tf32(val)
    amax = tl.max(tl.max(tl.abs(v), axis=1), axis=0)
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    store_rows(x, v * tf32_storage._power_of_two(16 - e), base, t0, T, H, D, BR, BD, i_d)
    tl.store(scales + s_idx, tf32_storage._power_of_two(e - 16))


@triton.jit
def _unrounded_store(x, scales, s_idx, val, base, t0, T, H: tl.constexpr, D: tl.constexpr,
                     BR: tl.constexpr, BD: tl.constexpr, i_d):
    """A planted `store_tf32_tile` that leaves the rounding to the fp16 conversion (ties to even,
    where `round_tf32`, as the products round, takes ties away from zero)."""
    amax = tl.max(tl.max(tl.abs(val), axis=1), axis=0)
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    store_rows(x, val * tf32_storage._power_of_two(14 - e), base, t0, T, H, D, BR, BD, i_d)
    tl.store(scales + s_idx, tf32_storage._power_of_two(e - 14))


STORES = {"store_tf32_tile": tf32_storage.store_tf32_tile, "overflowing": _overflowing_store,
          "unrounded": _unrounded_store}


@triton.jit
def _round_trip_kernel(src, half, scales, out, STORE: tl.constexpr, T: tl.constexpr, D: tl.constexpr,
                       BS: tl.constexpr):
    for i_d in tl.static_range(D // BS):
        STORE(half, scales, i_d, load_rows(src, 0, 0, T, 1, D, T, BS, i_d), 0, 0, T, 1, D, T, BS, i_d)
    tl.debug_barrier()
    s = tf32_storage.column_scales(scales, 0, D, D, BS)
    store_rows(out, load_rows(half, 0, 0, T, 1, D, T, D, 0) * s[None, :], 0, 0, T, 1, D, T, D, 0)


def round_trip(x: torch.Tensor, store: str = "store_tf32_tile") -> torch.Tensor:
    """x [ROWS, COLUMNS] float32 stored by `store` a block of BLOCK columns at a time, read back."""
    src = x.to(DEVICE)
    half = torch.empty(ROWS, COLUMNS, dtype=torch.float16, device=DEVICE)
    scales = torch.empty(COLUMNS // BLOCK, device=DEVICE)
    out = torch.empty(ROWS, COLUMNS, device=DEVICE)
    _round_trip_kernel[(1,)](src, half, scales, out, STORE=STORES[store], T=ROWS, D=COLUMNS, BS=BLOCK)
    return out.cpu()


def tf32(x: torch.Tensor) -> torch.Tensor:
    """x rounded to tf32 as `round_tf32` rounds (to nearest, ties away from zero), in torch."""
    return ((x.view(torch.int32) + 0x1000) & -0x2000).view(torch.float32)


def wide_tile(seed=0, span=26) -> torch.Tensor:
    """A tile of random signs and mantissas whose magnitudes span [2^-span, 2) (times 2^40 in
    its second block), with ties of the tf32 rounding whose nearest even is below them
    (1 + (4m + 1) 2^-11) in its first row."""
    gen = torch.Generator().manual_seed(seed)
    sign = torch.randint(0, 2, (ROWS, COLUMNS), generator=gen) * 2 - 1
    x = sign * (1 + torch.rand(ROWS, COLUMNS, generator=gen)) * 2.0 ** -torch.randint(
        0, span + 1, (ROWS, COLUMNS), generator=gen)
    x[0, :8] = 1 + 2.0 ** -11 * (4 * torch.arange(8) + 1)
    x[:, BLOCK:] *= 2.0 ** 40
    return x


def test_stored_tiles_read_back_as_the_tf32_values_a_product_takes():
    x = wide_tile()
    assert torch.equal(round_trip(x), tf32(x))


def test_elements_below_fp16s_normal_range_of_their_tile_err_by_at_most_a_subnormal_step():
    x = wide_tile(seed=1, span=40)
    got, want = round_trip(x), tf32(x)
    for block in (slice(0, BLOCK), slice(BLOCK, None)):
        largest = want[:, block].abs().max()
        step = largest * 2.0 ** -38   # fp16's subnormal step below a largest magnitude in [2^14, 2^15)
        assert ((got[:, block] - want[:, block]).abs() <= step).all()
        normal = want[:, block].abs() >= largest * 2.0 ** -28
        assert torch.equal(got[:, block][normal], want[:, block][normal])


def test_a_tile_of_zeros_and_a_tile_holding_an_inf_read_back_as_they_are():
    x = torch.zeros(ROWS, COLUMNS)
    x[3, BLOCK + 2] = float("inf")
    got = round_trip(x)
    assert torch.equal(got[:, :BLOCK], torch.zeros(ROWS, BLOCK))
    assert got[3, BLOCK + 2] == float("inf")


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")   # the interpreter's, planted
@pytest.mark.parametrize("store", ["overflowing", "unrounded"])
def test_planted_stores_do_not_read_back_as_the_tf32_values(store):
    x = wide_tile()
    got, want = round_trip(x, store), tf32(x)
    wrong = got != want
    assert wrong.any(), f"{store}: every element read back as its tf32 value"
    if store == "unrounded":   # the ties of the tf32 rounding come back rounded to even
        assert wrong[0, :8].all()
