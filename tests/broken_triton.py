"""Kernels the interpreter runs but a GPU cannot, to test the compile check itself."""
import triton
import triton.language as tl


@triton.jit
def shape_changing_loop_kernel(x, y, N: tl.constexpr):
    """A loop-carried value changes shape: the bug class that once reached the GPU from here."""
    offs = tl.arange(0, N)
    acc = tl.load(x + offs[:, None] * N + offs[None, :])
    for _ in range(2):
        acc = tl.sum(acc, axis=0)
    tl.store(y + offs, acc)


def launch(x, y):
    shape_changing_loop_kernel[(1,)](x, y, N=16)


@triton.jit
def oversized_shared_memory_kernel(a, b, c, N: tl.constexpr):
    """bf16 product of two [N, N] tiles: at N = 256 its operands need 256 KiB of shared memory."""
    offs = tl.arange(0, N)
    tile = offs[:, None] * N + offs[None, :]
    acc = tl.dot(tl.load(a + tile).to(tl.bfloat16), tl.load(b + tile).to(tl.bfloat16))
    tl.store(c + tile, acc)


def launch_oversized(a, b, c):
    oversized_shared_memory_kernel[(1,)](a, b, c, N=256)
