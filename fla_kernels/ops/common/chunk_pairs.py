"""The pair matrices of a chunk whose decay has one log gate per key channel (kda in chunks), and
their gradients.

Inside a chunk of BT rows, with G [BT, K] the chunk-local inclusive cumsum of the log gates
(`chunk_cumgate_channels`: float64 for fp32 inputs, float32 for 16-bit ones):
    P(a, b)_ts = sum_c a_tc b_sc exp(G_tc - G_sc)     for s <= t
The exponent is never split as exp(G_t) exp(-G_s), which overflows under strong decay. The rows
are taken in blocks of BC = 16: rows of block I against every column before it are one product
of a_I exp(G_I - G_e) and b_s exp(G_e - G_s) with e the last row before I, both exponents <= 0
(a factor that underflows bounds a product smaller still). The pairs inside one block are one
product too where the block's decay is at most SPLIT_SPAN (60) in every channel: the exponent
is split at the block's first row r, exp(G_t - G_r) exp(G_r - G_s), the second factor at most
exp(60), far inside float32; past that span (the extreme gate's -60 a step) they are summed a
column at a time, every block's j-th column at once (rows gathered), exponents <= 0 again.
Exponents are differences of that cumsum: in float64 they keep float32 precision at any decay;
in float32 they are off by up to half a float32 step of |G| (1.2e-4 at the extreme gate's
|G| <= 3840), far under a 16-bit rounding.

`pairs_kernel`: Akk = strictly_lower P(k, k), Aqk = lower P(q, k), float32 [B, T, H, BT].
`pair_grads_kernel`: given D = dL/dAqk and E = dL/dAkk (lower, float32, from the backward's
per-chunk kernels), adds their parts to dq, dk and dG, the gradient of G, in place:
    dq_t += sum_s D_ts k_s exp(G_t - G_s)         dk_s += sum_t D_ts q_t exp(G_t - G_s)
    dk_t += sum_s E_ts k_s exp(G_t - G_s)         dk_s += sum_t E_ts k_t exp(G_t - G_s)
    dG_t += a_t * (its row sum),                  dG_s -= b_s * (its column sum)
The diagonal of Aqk carries no gate (exp(0)): its pair adds and subtracts q_t k_t D_tt on the same
row of dG, so it is left out of dG instead of cancelling to rounding. Products take tf32 operands
(`mma`). The pairs' part of dG sums to zero over a chunk; formed as a_t * (its row sum) with a_t
unrounded while the product read a rounded b_s, each pair's two sides differed by the operands'
10-bit roundings, which do not cancel (fp16: dg summed over t 2 to 6 times its bound, each
element well inside its own), so dG takes both sides of a pair from the same rounded
operands (`tf32_operand`): a pair's row term and its column term are then the same product of
the same three numbers, and the sums cancel to float32 rounding. Akk and Aqk have no cancelling
partner: one tf32 product each.
"""
import triton
import triton.language as tl

from fla_kernels.ops.common.dot import mma, tf32_operand
from fla_kernels.ops.common.tiles import gather_rows, head_program, load_rows, load_rows_t, store_rows

SPLIT_SPAN = tl.constexpr(60.0)   # the largest decay within a block whose exponent is split at its first row


@triton.jit
def cumgate_rows(gc, base, t, m_t, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, i_k=0):
    """[len(t), BK] rows t, columns i_k*BK.., of the cumulative gates gc [B, T, H, K] where m_t
    holds (zero elsewhere), in gc's dtype (`chunk_cumgate_channels`)."""
    d = i_k * BK + tl.arange(0, BK)
    offs = base + t.to(tl.int64)[:, None] * (H * K) + d[None, :]
    return tl.load(gc + offs, mask=m_t[:, None] & (d[None, :] < K), other=0)


@triton.jit
def cumgate_cols(gc, base, t, m_t, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, i_k=0):
    """The same rows as `cumgate_rows`, read transposed: [BK, len(t)]."""
    d = i_k * BK + tl.arange(0, BK)
    offs = base + t.to(tl.int64)[None, :] * (H * K) + d[:, None]
    return tl.load(gc + offs, mask=m_t[None, :] & (d[:, None] < K), other=0)


@triton.jit
def cumgate_row(gc, base, t, T, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, i_k=0):
    """[BK] row t, columns i_k*BK.., of gc [B, T, H, K] (zero past T), in gc's dtype."""
    d = i_k * BK + tl.arange(0, BK)
    m = d < tl.where(t < T, K, 0)
    return tl.load(gc + base + t.to(tl.int64) * (H * K) + d, mask=m, other=0)


@triton.jit
def decay(x):
    """exp of an exponent (a difference of cumulative gates) that is <= 0 in exact arithmetic,
    in float32."""
    return tl.exp(tl.minimum(x.to(tl.float32), 0.0))


@triton.jit
def pair_entries(A, row, c0, t, cols, m, T, H: tl.constexpr, BT: tl.constexpr):
    """[len(t)] float32 entries (t, cols) of the chunk at c0 of a pair matrix A [B, T, H, BT] of
    row (tiles.head_program), where m holds and t is inside the sequence (zero elsewhere): one
    entry a row, read where it lies instead of picked out of a [BT, BT] tile."""
    offs = (row * BT + (c0 + t).to(tl.int64) * (H * BT)) + cols
    return tl.load(A + offs, mask=m & ((c0 + t) < T), other=0)


@triton.jit
def _pair_grad_sums(D, E, Dt, Et, dAqk, dAkk, q, k, b_q, b_k, G, gc, row, base, c0, T, H: tl.constexpr,
                    K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                    FP32_DOT: tl.constexpr, i_k):
    """(rq, rk + c, dG) [BT, BK] of the chunk at c0 in key columns i_k*BK.., for D and E its
    [BT, BT] lower pair gradients (Dt, Et their transposes) as product operands
    (`tf32_operand`) and G the rows' cumulative gates:
        rq_t = sum_{s<t} D_ts k_s exp(G_t - G_s)      rk_t = sum_{s<t} E_ts k_s exp(G_t - G_s)
        c_s = sum_{t>s} (D_ts q_t + E_ts k_t) exp(G_t - G_s)
    and dG_t = q_t rq_t + k_t (rk_t - c_t), the pairs' part of the gate gradient, whose sum over
    the chunk is zero: every pair adds its term to its row and takes it from its column.
    Step m takes the rows of block m against every row before it, with e the last row before
    block m: the row sums through (a exp(G_t - G_e)) D (b exp(G_e - G_s)), the column sums of
    the same pairs through the transposes and the same operands, so that dG takes each pair's
    two sides from the same rounded numbers (the module's note). Pairs inside one block split
    their exponent at the block's first row r where its decay is at most SPLIT_SPAN, else are
    summed a column at a time, every block's j-th at once, in float32."""
    r = tl.arange(0, BT)
    rq = tl.zeros([BT, BK], dtype=tl.float32)
    rkc = tl.zeros([BT, BK], dtype=tl.float32)
    dG = tl.zeros([BT, BK], dtype=tl.float32)
    for m in tl.static_range(1, BT // BC):
        G_e = cumgate_row(gc, base, c0 + m * BC - 1, T, H, K, BK, i_k)
        before = (r < m * BC)[:, None]
        own = ((r // BC) == m)[:, None]
        X = decay(tl.where(before, G_e[None, :] - G, G - G_e[None, :]))
        kX = tf32_operand(b_k * X, FP32_DOT)
        k_before = tl.where(before, kX, 0.0)
        q_own = tl.where(own, tf32_operand(b_q * X, FP32_DOT), 0.0)
        k_own = tl.where(own, kX, 0.0)
        y_q = mma(tl.where(own, D, 0.0), k_before, FP32_DOT, tl.float32)
        y_k = mma(tl.where(own, E, 0.0), k_before, FP32_DOT, tl.float32)
        z = mma(tl.where(before, Dt, 0.0), q_own, FP32_DOT, tl.float32)
        z += mma(tl.where(before, Et, 0.0), k_own, FP32_DOT, tl.float32)
        rq += y_q * X
        rkc += (y_k + z) * X
        dG += q_own * y_q + k_own * y_k - k_before * z
    first = (r // BC) * BC
    G_r = cumgate_rows(gc, base, c0 + first, (c0 + first) < T, H, K, BK, i_k)
    rise = tl.where((c0 + r < T)[:, None], G_r - G, 0.0)
    if tl.max(tl.max(rise, axis=1), axis=0) <= SPLIT_SPAN:
        fall, up = decay(-rise), tl.exp(rise.to(tl.float32))
        same = (r[:, None] // BC) == (r[None, :] // BC)
        below, above = same & (r[:, None] > r[None, :]), same & (r[:, None] < r[None, :])
        k_up = tf32_operand(b_k * up, FP32_DOT)
        q_fall, k_fall = tf32_operand(b_q * fall, FP32_DOT), tf32_operand(b_k * fall, FP32_DOT)
        y_q = mma(tl.where(below, D, 0.0), k_up, FP32_DOT, tl.float32)
        y_k = mma(tl.where(below, E, 0.0), k_up, FP32_DOT, tl.float32)
        z = mma(tl.where(above, Dt, 0.0), q_fall, FP32_DOT, tl.float32)
        z += mma(tl.where(above, Et, 0.0), k_fall, FP32_DOT, tl.float32)
        rq += fall * y_q
        rkc += fall * y_k + up * z
        dG += q_fall * y_q + k_fall * y_k - k_up * z
    else:
        sq = tl.zeros([BT, BK], dtype=tl.float32)
        sk = tl.zeros([BT, BK], dtype=tl.float32)
        sc = tl.zeros([BT, BK], dtype=tl.float32)
        for j in range(BC):
            src = first + j
            m_src = (c0 + src) < T
            k_j = gather_rows(k, base, c0 + src, m_src, H, K, BK, i_k)
            q_j = gather_rows(q, base, c0 + src, m_src, H, K, BK, i_k)
            after = (r % BC > j)[:, None]
            diff = G - cumgate_rows(gc, base, c0 + src, m_src, H, K, BK, i_k)
            X = decay(tl.where(after, diff, -diff))
            below, above = r % BC > j, r % BC < j
            d_q = pair_entries(dAqk, row, c0, r, src, below, T, H, BT)
            d_k = pair_entries(dAkk, row, c0, r, src, below, T, H, BT)
            sq += d_q[:, None] * k_j * X
            sk += d_k[:, None] * k_j * X
            c_q = pair_entries(dAqk, row, c0, src, r, above, T, H, BT)
            c_k = pair_entries(dAkk, row, c0, src, r, above, T, H, BT)
            sc += (c_q[:, None] * q_j + c_k[:, None] * k_j) * X
        rq += sq
        rkc += sk + sc
        dG += b_q * sq + b_k * (sk - sc)
    return rq, rkc, dG


@triton.jit
def _chunk_tiles(q, k, gc, i_c, row, i_k, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                 BK: tl.constexpr):
    """(c0, base, q, k [BT, BK] float32, G [BT, BK] in gc's dtype) of chunk i_c of row
    (tiles.head_program) in key columns i_k*BK..: its first row c0, base = row * K."""
    c0 = i_c * BT
    base = row * K
    t = c0 + tl.arange(0, BT)
    return (c0, base, load_rows(q, base, c0, T, H, K, BT, BK, i_k),
            load_rows(k, base, c0, T, H, K, BT, BK, i_k), cumgate_rows(gc, base, t, t < T, H, K, BK, i_k))


@triton.jit(do_not_specialize=["T"])
def pairs_kernel(q, k, gc, Akk, Aqk, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                 BC: tl.constexpr, BK: tl.constexpr, FP32_DOT: tl.constexpr):
    """Per chunk: Akk (strictly lower) and Aqk (lower) [B, T, H, BT] float32, summed over K a
    block of BK key columns at a time. A block's own pairs are one product where its decay is
    at most SPLIT_SPAN in every channel, the exponent split at the block's first row r:
    exp(G_t - G_s) = exp(G_t - G_r) exp(G_r - G_s), the second factor at most exp(SPLIT_SPAN);
    past that they are summed a column at a time, every exponent <= 0."""
    i_c, _, _, _, _, row = head_program(T, H, tl.cdiv(T, BT), 1)
    r = tl.arange(0, BT)
    first = (r // BC) * BC
    same = (r[:, None] // BC) == (r[None, :] // BC)
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
            b_kk += tl.where(in_I, mma(tl.where(in_I, b_k * dec, 0.0), before, FP32_DOT, tl.float32),
                             0.0)
            b_qk += tl.where(in_I, mma(tl.where(in_I, b_q * dec, 0.0), before, FP32_DOT, tl.float32),
                             0.0)
        G_r = cumgate_rows(gc, base, c0 + first, (c0 + first) < T, H, K, BK, i_k)
        rise = tl.where((t < T)[:, None], G_r - b_G, 0.0)
        if tl.max(tl.max(rise, axis=1), axis=0) <= SPLIT_SPAN:
            fall = decay(-rise)
            up = tl.trans(b_k * tl.exp(rise.to(tl.float32)))
            b_kk += tl.where(same & (r[:, None] > r[None, :]),
                             mma(b_k * fall, up, FP32_DOT, tl.float32), 0.0)
            b_qk += tl.where(same & (r[:, None] >= r[None, :]),
                             mma(b_q * fall, up, FP32_DOT, tl.float32), 0.0)
        else:
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
                      BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, FP32_DOT: tl.constexpr):
    """Per chunk and block of BK key columns (each column's sums are its own): adds the pair
    matrices' parts to dq, dk and dG [B, T, H, K] float32 in place."""
    i_k, i_c, _, _, _, row = head_program(T, H, tl.cdiv(K, BK), tl.cdiv(T, BT))
    c0, base, b_q, b_k, b_G = _chunk_tiles(q, k, gc, i_c, row, i_k, T, H, K, BT, BK)
    r = tl.arange(0, BT)
    b_D = load_rows(dAqk, row * BT, c0, T, H, BT, BT, BT, 0)
    dd = tl.sum(tl.where(r[:, None] == r[None, :], b_D, 0.0), axis=1)[:, None]
    b_D = tf32_operand(b_D, FP32_DOT)
    b_E = tf32_operand(load_rows(dAkk, row * BT, c0, T, H, BT, BT, BT, 0), FP32_DOT)
    b_Dt = tf32_operand(load_rows_t(dAqk, row * BT, c0, T, H, BT, BT, BT, 0), FP32_DOT)
    b_Et = tf32_operand(load_rows_t(dAkk, row * BT, c0, T, H, BT, BT, BT, 0), FP32_DOT)
    rq, rkc, pair_dG = _pair_grad_sums(b_D, b_E, b_Dt, b_Et, dAqk, dAkk, q, k, b_q, b_k, b_G, gc, row,
                                       base, c0, T, H, K, BT, BC, BK, FP32_DOT, i_k)
    b_dq = load_rows(dq, base, c0, T, H, K, BT, BK, i_k) + rq + dd * b_k
    b_dk = load_rows(dk, base, c0, T, H, K, BT, BK, i_k) + rkc + dd * b_q
    store_rows(dq, b_dq, base, c0, T, H, K, BT, BK, i_k)
    store_rows(dk, b_dk, base, c0, T, H, K, BT, BK, i_k)
    b_dG = load_rows(dG, base, c0, T, H, K, BT, BK, i_k) + pair_dG
    store_rows(dG, b_dG, base, c0, T, H, K, BT, BK, i_k)
