"""A kernel for tests/test_pipeline_races.py: a loop whose loaded tiles feed a product (so Triton
pipelines the loads); with REREAD a runtime branch after the product uses the loaded tile again,
as kda's 16-row pairs kernel did, and without it the branch uses a sum formed before it."""
import triton
import triton.language as tl


@triton.jit
def branch_after_product(a, b, out, flag, K: tl.constexpr, BK: tl.constexpr, REREAD: tl.constexpr):
    r, c, n = tl.arange(0, 16), tl.arange(0, BK), tl.arange(0, 64)
    acc = tl.zeros([16, 64], dtype=tl.float32)
    for i_k in range(K // BK):
        x = tl.load(a + r[:, None] * K + i_k * BK + c[None, :])
        y = tl.load(b + (i_k * BK + c)[:, None] * 64 + n[None, :])
        acc += tl.dot(x.to(tl.bfloat16), y.to(tl.bfloat16))
        s = tl.sum(x, axis=1)[:, None]
        if tl.load(flag) > 0:
            for j in range(4):
                if REREAD:
                    acc += tl.sum(x * j, axis=1)[:, None]
                else:
                    acc += s * j
    tl.store(out + r[:, None] * 64 + n[None, :], acc)


# the racing loop as an upstream library ships its kernels: autotuned, one config pipelined
autotuned_branch_after_product = triton.autotune(
    configs=[triton.Config({}, num_warps=4, num_stages=1), triton.Config({}, num_warps=4, num_stages=3)],
    key=["K"])(branch_after_product)
