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
    """bf16 products of [N, 2N] and [2N, N] tiles summed over a loop: at N = 64 with 8 pipeline
    stages its buffered operands need 448 KiB of shared memory (a small dot: quick to compile)."""
    offs, wide = tl.arange(0, N), tl.arange(0, 2 * N)
    acc = tl.zeros([N, N], dtype=tl.float32)
    for i in range(4):
        x = tl.load(a + i * 2 * N * N + offs[:, None] * 2 * N + wide[None, :]).to(tl.bfloat16)
        y = tl.load(b + i * 2 * N * N + wide[:, None] * N + offs[None, :]).to(tl.bfloat16)
        acc += tl.dot(x, y)
    tl.store(c + offs[:, None] * N + offs[None, :], acc)


def launch_oversized(a, b, c):
    oversized_shared_memory_kernel[(1,)](a, b, c, N=64, num_stages=8)


@triton.jit
def out_of_bounds_store_kernel(x):
    """A store a terabyte past the tensor: on a GPU an illegal address, which kills the context."""
    tl.store(x + (1 << 40), 1.0)


def chunk_rwkv6_killing_the_context_at_T30(r, k, v, w, u, **kwargs):
    """Our chunk_rwkv6, except that at T = 30 it first makes an out-of-bounds store."""
    from fla_kernels import chunk_rwkv6
    if r.shape[1] == 30:
        out_of_bounds_store_kernel[(1,)](r)
    return chunk_rwkv6(r, k, v, w, u, **kwargs)
