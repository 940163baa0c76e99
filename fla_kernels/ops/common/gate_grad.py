"""Gradient of per-channel log gates from chunk-local sums.

For a recurrence S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t read as q_t S_{t-1}
(rwkv6) or q_t S_t (gla), the loss depends on a chunk's gates only through
q * exp(G_prev), k * exp(-G) and the state leaving the chunk, with G the
chunk-local cumulative gate. Hence, for t in chunk c,

    dw_t = sum_{s > t} q_s dq_s - sum_{s >= t} k_s dk_s + sum_v(h_{c+1} * dh_{c+1})

(sums over the chunk; `s > t` becomes `s >= t` when the output reads S_t).
dq, dk are the gradients through the state only (no bonus/diagonal term);
`boundary` holds sum_v of the state leaving each chunk times its gradient
(for the last chunk: the final state times dht). Summing only inside a chunk
keeps the error independent of T, unlike a reverse cumsum over the sequence.

Terms that carry no gate (a pair (i, j) whose gate product is empty, such as
neighbours i = j + 1 in rwkv6, or the last row's own path into the leaving
state) appear once with + and once with -; a caller may leave them out of
both sides, which keeps dw precise when strong decay makes it tiny.
"""
import torch
import triton
import triton.language as tl
from fla_kernels.ops.common.launch import flat_grid, launch
from fla_kernels.ops.common.tiles import flat_program


# widest K-block of a program: the whole K = 128 in one [64, 128] tile took 255 registers
# (H100: 0.202 -> 0.177 ms at 64; benchmarks/tuning.md)
BLOCK_K = 64


@triton.jit(do_not_specialize=["T", "NT"])
def _chunk_gate_grad_kernel(q, dq, k, dk, boundary, dw, T, H: tl.constexpr, K: tl.constexpr,
                            NT, BT: tl.constexpr, BK: tl.constexpr, Q_READS_CURRENT: tl.constexpr):
    i_k, i_c, i_bh = flat_program(tl.cdiv(K, BK), NT)
    i_c = i_c.to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    t = i_c * BT + tl.arange(0, BT).to(tl.int64)
    d = i_k * BK + tl.arange(0, BK)
    chunk_end = tl.minimum(i_c * BT + BT, T)
    mask = (t[:, None] < T) & (d[None, :] < K)
    offs = ((i_b * T + t[:, None]) * H + i_h) * K + d[None, :]
    # q rows that count for row t: s >= t (reads S_t) or s > t (reads S_{t-1}): load them shifted
    # by one in the second case, so the reverse cumsum is already exclusive and nothing cancels.
    if Q_READS_CURRENT:
        q_mask = mask
        q_offs = offs
    else:
        q_mask = ((t[:, None] + 1) < chunk_end) & (d[None, :] < K)
        q_offs = offs + H * K
    b_q = tl.load(q + q_offs, mask=q_mask, other=0).to(tl.float32)
    b_dq = tl.load(dq + q_offs, mask=q_mask, other=0).to(tl.float32)
    b_k = tl.load(k + offs, mask=mask, other=0).to(tl.float32)
    b_dk = tl.load(dk + offs, mask=mask, other=0).to(tl.float32)
    b_bound = tl.load(boundary + (i_bh * NT + i_c) * K + d, mask=d < K, other=0).to(tl.float32)
    b_dw = (tl.cumsum(b_q * b_dq, axis=0, reverse=True) - tl.cumsum(b_k * b_dk, axis=0, reverse=True)
            + b_bound[None, :])
    tl.store(dw + offs, b_dw.to(dw.dtype.element_ty), mask=mask)


def chunk_gate_grad(q, dq, k, dk, boundary, chunk_size, q_reads_current, out_dtype):
    """dw [B, T, H, K] in out_dtype; boundary is [B, H, NT, K] float32 with NT = ceil(T / chunk_size).

    One program per (K-block of at most BLOCK_K columns, chunk, b*h)."""
    B, T, H, K = q.shape
    NT = triton.cdiv(T, chunk_size)
    assert boundary.shape == (B, H, NT, K), boundary.shape
    dw = torch.empty(B, T, H, K, dtype=out_dtype, device=q.device)
    BK = min(max(16, triton.next_power_of_2(K)), BLOCK_K)
    launch(_chunk_gate_grad_kernel, flat_grid(triton.cdiv(K, BK), NT, B * H),
        q, dq, k, dk, boundary.contiguous(), dw, T, H, K, NT, BT=chunk_size, BK=BK,
        Q_READS_CURRENT=q_reads_current)
    return dw
