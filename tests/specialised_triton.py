"""A kernel whose arguments Triton's launcher specialises, to test that the compile check does the
same (tests/gpu_compile.py): pointers to 16-byte aligned data and ints divisible by 16 carry
divisibility 16 into the compiler (so loads vectorise), an int equal to 1 becomes a constant, and
`do_not_specialize` keeps an int a plain argument."""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_plain"])
def scaled_copy_kernel(x, y, n, one, n_plain, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n + n_plain
    tl.store(y + offs, tl.load(x + offs, mask=mask) * one, mask=mask)


def launch(x, y, n, one, n_plain):
    scaled_copy_kernel[(1,)](x, y, n, one, n_plain, BLOCK=64)
