"""Kernels for tests/test_pipeline_races.py: a loop whose loaded tiles feed a product (so Triton
pipelines the loads) and are used again inside a runtime branch after it, as kda's 16-row pairs
kernel did; and the same loop with that use taken before the branch."""
import triton
import triton.language as tl


@triton.jit
def branch_rereads_tile(a, b, out, flag, K: tl.constexpr, BK: tl.constexpr):
    r, c, n = tl.arange(0, 16), tl.arange(0, BK), tl.arange(0, 64)
    acc = tl.zeros([16, 64], dtype=tl.float32)
    for i_k in range(K // BK):
        x = tl.load(a + r[:, None] * K + i_k * BK + c[None, :])
        y = tl.load(b + (i_k * BK + c)[:, None] * 64 + n[None, :])
        acc += tl.dot(x.to(tl.bfloat16), y.to(tl.bfloat16))
        if tl.load(flag) > 0:
            for j in range(4):
                acc += tl.sum(x * j, axis=1)[:, None]
    tl.store(out + r[:, None] * 64 + n[None, :], acc)


@triton.jit
def branch_uses_a_sum(a, b, out, flag, K: tl.constexpr, BK: tl.constexpr):
    r, c, n = tl.arange(0, 16), tl.arange(0, BK), tl.arange(0, 64)
    acc = tl.zeros([16, 64], dtype=tl.float32)
    for i_k in range(K // BK):
        x = tl.load(a + r[:, None] * K + i_k * BK + c[None, :])
        y = tl.load(b + (i_k * BK + c)[:, None] * 64 + n[None, :])
        acc += tl.dot(x.to(tl.bfloat16), y.to(tl.bfloat16))
        s = tl.sum(x, axis=1)[:, None]
        if tl.load(flag) > 0:
            for j in range(4):
                acc += s * j
    tl.store(out + r[:, None] * 64 + n[None, :], acc)


# the racing loop as an upstream library ships its kernels: autotuned, one config pipelined
autotuned_branch_rereads_tile = triton.autotune(
    configs=[triton.Config({}, num_warps=4, num_stages=1), triton.Config({}, num_warps=4, num_stages=3)],
    key=["K"])(branch_rereads_tile)
