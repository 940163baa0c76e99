"""The pair matrices of a chunk whose decay has one log gate per key channel (kda in chunks), and
their gradients.

Inside a chunk of BT rows, with G [BT, K] the float64 chunk-local inclusive cumsum of the log
gates (`chunk_cumgate_channels`):
    P(a, b)_ts = sum_c a_tc b_sc exp(G_tc - G_sc)     for s <= t
The exponent is never split as exp(G_t) exp(-G_s), which overflows under strong decay. The rows
are taken in blocks of BC = 16: rows of block I against every column before it are one product
of a_I exp(G_I - G_e) and b_s exp(G_e - G_s) with e the last row before I, both exponents <= 0
(a factor that underflows bounds a product smaller still); the pairs inside one block are summed
a column at a time, every block's j-th column at once (rows gathered), exponents <= 0 again.
Exponents are differences of the float64 cumsum, so they keep float32 precision at any decay.

`pairs_kernel`: Akk = strictly_lower P(k, k), Aqk = lower P(q, k), float32 [B, T, H, BT].
`pair_grads_kernel`: given D = dL/dAqk and E = dL/dAkk (lower, float32, from the backward's
per-chunk kernels), adds their parts to dq, dk and (GATE_GRAD) dG, the gradient of G, in place:
    dq_t += sum_s D_ts k_s exp(G_t - G_s)         dk_s += sum_t D_ts q_t exp(G_t - G_s)
    dk_t += sum_s E_ts k_s exp(G_t - G_s)         dk_s += sum_t E_ts k_t exp(G_t - G_s)
    dG_t += a_t * (its row sum),                  dG_s -= b_s * (its column sum)
The diagonal of Aqk carries no gate (exp(0)): its pair adds and subtracts q_t k_t D_tt on the same
row of dG, so it is left out of dG instead of cancelling to rounding. The row and the column sums
of one pair are formed by different products, so their roundings do not cancel in dG: with tf32
operands (10 bits) the residue biased dg the same way at every token (fp16, H100: dg summed
over t 1.1 to 4 times its bound, each element well inside its own), so those products are split
to about 16 bits (`mma_split`). A gate shared by every channel (a scalar gate on these kernels)
takes its gradient from the pair matrices themselves instead (`scalar_pair_gate_grad`): one set
of numbers summed by rows and by columns, so the pairs cancel over a chunk as they should.
"""
import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.dot import mma_split
from fla_kernels.ops.common.tiles import gather_rows, head_program, load_rows, load_rows_t, store_rows


@triton.jit
def cumgate_rows(gc, base, t, m_t, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, i_k=0):
    """[len(t), BK] float64 rows t, columns i_k*BK.., of the cumulative gates gc [B, T, H, K]
    where m_t holds (zero elsewhere)."""
    d = i_k * BK + tl.arange(0, BK)
    offs = base + t.to(tl.int64)[:, None] * (H * K) + d[None, :]
    return tl.load(gc + offs, mask=m_t[:, None] & (d[None, :] < K), other=0).to(tl.float64)


@triton.jit
def cumgate_cols(gc, base, t, m_t, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, i_k=0):
    """The same rows as `cumgate_rows`, read transposed: [BK, len(t)] float64."""
    d = i_k * BK + tl.arange(0, BK)
    offs = base + t.to(tl.int64)[None, :] * (H * K) + d[:, None]
    return tl.load(gc + offs, mask=m_t[None, :] & (d[:, None] < K), other=0).to(tl.float64)


@triton.jit
def cumgate_row(gc, base, t, T, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, i_k=0):
    """[BK] float64 row t, columns i_k*BK.., of gc [B, T, H, K] (zero past T)."""
    d = i_k * BK + tl.arange(0, BK)
    m = d < tl.where(t < T, K, 0)
    return tl.load(gc + base + t.to(tl.int64) * (H * K) + d, mask=m, other=0).to(tl.float64)


@triton.jit
def decay(x):
    """exp of a float64 exponent that is <= 0 in exact arithmetic, in float32."""
    return tl.exp(tl.minimum(x.to(tl.float32), 0.0))


@triton.jit
def _pair_sums(Dx, x, x_ptr, G, gc, base, c0, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
               BC: tl.constexpr, BK: tl.constexpr, FP32_DOT: tl.constexpr, COLUMNS: tl.constexpr,
               i_k):
    """[BT, BK] for D [BT, BT] lower and x [BT, BK] the chunk's rows of x_ptr [B, T, H, K] in key
    columns i_k*BK.. (gathered again for the blocks' own pairs), G their cumulative gates; at row
    t, the sum over s < t of D_ts x_s exp(G_t - G_s) (Dx = D); with COLUMNS, at row s the sum over
    t > s of D_ts x_t exp(G_t - G_s) (Dx = D^T). Either way the reference row e of block
    boundary m is the last before it, and every exponent is <= 0."""
    sign = -1.0 if COLUMNS else 1.0
    r = tl.arange(0, BT)
    acc = tl.zeros([BT, BK], dtype=tl.float32)
    for m in tl.static_range(1, BT // BC):
        G_e = cumgate_row(gc, base, c0 + m * BC - 1, T, H, K, BK, i_k)
        if COLUMNS:
            others, own = r >= m * BC, (r // BC) == m - 1
        else:
            others, own = r < m * BC, (r // BC) == m
        other = tl.where(others[:, None], x * decay(sign * (G_e[None, :] - G)), 0.0)
        part = mma_split(tl.where(own[:, None], Dx, 0.0), other, FP32_DOT)
        acc += tl.where(own[:, None], part * decay(sign * (G - G_e[None, :])), 0.0)
    first = (r // BC) * BC
    for j in range(BC):
        src = first + j
        m_src = (c0 + src) < T
        x_j = gather_rows(x_ptr, base, c0 + src, m_src, H, K, BK, i_k)
        G_j = cumgate_rows(gc, base, c0 + src, m_src, H, K, BK, i_k)
        d = tl.sum(tl.where(r[None, :] == src[:, None], Dx, 0.0), axis=1)
        d = tl.where((r % BC < j) if COLUMNS else (r % BC > j), d, 0.0)
        acc += d[:, None] * x_j * decay(sign * (G - G_j))
    return acc


@triton.jit
def _chunk_tiles(q, k, gc, i_c, row, i_k, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                 BK: tl.constexpr):
    """(c0, base, q, k [BT, BK] float32, G [BT, BK] float64) of chunk i_c of row (tiles.head_program)
    in key columns i_k*BK..: its first row c0, base = row * K."""
    c0 = i_c * BT
    base = row * K
    t = c0 + tl.arange(0, BT)
    return (c0, base, load_rows(q, base, c0, T, H, K, BT, BK, i_k),
            load_rows(k, base, c0, T, H, K, BT, BK, i_k), cumgate_rows(gc, base, t, t < T, H, K, BK, i_k))


@triton.jit(do_not_specialize=["T"])
def pairs_kernel(q, k, gc, Akk, Aqk, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                 BC: tl.constexpr, BK: tl.constexpr, FP32_DOT: tl.constexpr):
    """Per chunk: Akk (strictly lower) and Aqk (lower) [B, T, H, BT] float32, summed over K a
    block of BK key columns at a time."""
    i_c, _, _, _, _, row = head_program(T, H, tl.cdiv(T, BT), 1)
    r = tl.arange(0, BT)
    first = (r // BC) * BC
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    b_qk = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        c0, base, b_q, b_k, b_G = _chunk_tiles(q, k, gc, i_c, row, i_k, T, H, K, BT, BK)
        t = c0 + r
        b_kt = load_rows_t(k, base, c0, T, H, K, BT, BK, i_k)
        b_Gt = cumgate_cols(gc, base, t, t < T, H, K, BK, i_k)
        for I in tl.static_range(1, BT // BC):
            G_e = cumgate_row(gc, base, c0 + I * BC - 1, T, H, K, BK, i_k)
            before = tl.where(r[None, :] < I * BC, b_kt * decay(G_e[:, None] - b_Gt), 0.0)
            in_I = ((r // BC) == I)[:, None]
            dec = decay(b_G - G_e[None, :])
            b_kk += tl.where(in_I, mma_split(tl.where(in_I, b_k * dec, 0.0), before, FP32_DOT), 0.0)
            b_qk += tl.where(in_I, mma_split(tl.where(in_I, b_q * dec, 0.0), before, FP32_DOT), 0.0)
        for j in range(BC):
            src = first + j
            m_src = (c0 + src) < T
            b_j = gather_rows(k, base, c0 + src, m_src, H, K, BK, i_k)
            dec = b_j * decay(b_G - cumgate_rows(gc, base, c0 + src, m_src, H, K, BK, i_k))
            at = r[None, :] == src[:, None]
            b_kk += tl.where(at & (r % BC > j)[:, None], tl.sum(b_k * dec, axis=1)[:, None], 0.0)
            b_qk += tl.where(at & (r % BC >= j)[:, None], tl.sum(b_q * dec, axis=1)[:, None], 0.0)
    c0 = i_c * BT
    store_rows(Akk, b_kk, row * BT, c0, T, H, BT, BT, BT, 0)
    store_rows(Aqk, b_qk, row * BT, c0, T, H, BT, BT, BT, 0)


@triton.jit(do_not_specialize=["T"])
def pair_grads_kernel(q, k, gc, dAqk, dAkk, dq, dk, dG, T, H: tl.constexpr, K: tl.constexpr,
                      BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, FP32_DOT: tl.constexpr,
                      GATE_GRAD: tl.constexpr):
    """Per chunk and block of BK key columns (each column's sums are its own): adds the pair
    matrices' parts to dq, dk and (GATE_GRAD) dG [B, T, H, K] float32 in place."""
    i_k, i_c, _, _, _, row = head_program(T, H, tl.cdiv(K, BK), tl.cdiv(T, BT))
    c0, base, b_q, b_k, b_G = _chunk_tiles(q, k, gc, i_c, row, i_k, T, H, K, BT, BK)
    r = tl.arange(0, BT)
    b_D = load_rows(dAqk, row * BT, c0, T, H, BT, BT, BT, 0)
    b_E = load_rows(dAkk, row * BT, c0, T, H, BT, BT, BT, 0)
    b_Dt = load_rows_t(dAqk, row * BT, c0, T, H, BT, BT, BT, 0)
    b_Et = load_rows_t(dAkk, row * BT, c0, T, H, BT, BT, BT, 0)
    rq = _pair_sums(b_D, b_k, k, b_G, gc, base, c0, T, H, K, BT, BC, BK, FP32_DOT, False, i_k)
    rk = _pair_sums(b_E, b_k, k, b_G, gc, base, c0, T, H, K, BT, BC, BK, FP32_DOT, False, i_k)
    cq = _pair_sums(b_Dt, b_q, q, b_G, gc, base, c0, T, H, K, BT, BC, BK, FP32_DOT, True, i_k)
    ck = _pair_sums(b_Et, b_k, k, b_G, gc, base, c0, T, H, K, BT, BC, BK, FP32_DOT, True, i_k)
    dd = tl.sum(tl.where(r[:, None] == r[None, :], b_D, 0.0), axis=1)[:, None]
    b_dq = load_rows(dq, base, c0, T, H, K, BT, BK, i_k) + rq + dd * b_k
    b_dk = load_rows(dk, base, c0, T, H, K, BT, BK, i_k) + rk + cq + ck + dd * b_q
    store_rows(dq, b_dq, base, c0, T, H, K, BT, BK, i_k)
    store_rows(dk, b_dk, base, c0, T, H, K, BT, BK, i_k)
    if GATE_GRAD:
        b_dG = load_rows(dG, base, c0, T, H, K, BT, BK, i_k) + b_q * rq + b_k * (rk - cq - ck)
        store_rows(dG, b_dG, base, c0, T, H, K, BT, BK, i_k)


def scalar_pair_gate_grad(dA: torch.Tensor, A: torch.Tensor, chunk: int) -> torch.Tensor:
    """[B, T, H] float32: the pairs' part of the gradient of a scalar cumulative gate G, from a
    pair matrix A [B, T, H, chunk] (row t of a chunk against its columns s) and its gradient dA.
    A_ts carries exp(G_t - G_s), so Z = dA * A strictly below the diagonal adds its row sums at t
    and takes its column sums away at s; the diagonal carries no gate."""
    B, T, H, _ = A.shape
    NT = -(-T // chunk)
    local = torch.arange(NT * chunk, device=A.device) % chunk
    strict = torch.arange(chunk, device=A.device)[None, :] < local[:, None]
    Z = torch.zeros(B, NT * chunk, H, chunk, dtype=torch.float32, device=A.device)
    Z[:, :T] = dA * A
    Z = Z * strict[None, :, None, :]
    columns = Z.view(B, NT, chunk, H, chunk).sum(2).transpose(2, 3).reshape(B, NT * chunk, H)
    return (Z.sum(-1) - columns)[:, :T]
