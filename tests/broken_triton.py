"""A kernel the interpreter runs but the compiler rejects, to test the compile check itself."""
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
