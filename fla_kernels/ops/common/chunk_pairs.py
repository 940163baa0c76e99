"""The pair matrices of a chunk whose decay has one log gate per key channel (kda in chunks), and
their gradients.

Inside a chunk of BT rows, with G [BT, K] the chunk-local inclusive cumsum of the log gates
(`chunk_cumgate_channels`: float64 for fp32 inputs, float32 for 16-bit ones):
    P(a, b)_ts = sum_c a_tc b_sc exp(G_tc - G_sc)     for s <= t
The exponent is never split as exp(G_t) exp(-G_s), which overflows under strong decay. The rows
are taken in blocks of BC = 16, a program per block (and chunk, and head): the pairs of block I's
rows with block J < I are one [BC, BC] product of a_I exp(G_I - G_e) and b_J exp(G_e - G_J)
with e the last row before I, both exponents <= 0 (a factor that underflows bounds a product
smaller still). The pairs inside one block are one product too where that block's decay is at
most SPLIT_SPAN (60) in every channel: the exponent is split at the block's first row r,
exp(G_t - G_r) exp(G_r - G_s), the second factor at most exp(60), far inside float32; past that
span (the extreme gate's -60 a step) that block's are summed a column at a time, exponents <= 0
again. Each block decides for itself. A program's products are [BC, BK] by [BK, BC] (or
[BC, BC] by [BC, BK]), so none multiplies the zeros of another block's pairs.
Exponents are differences of that cumsum: in float64 they keep float32 precision at any decay;
in float32 they are off by up to half a float32 step of |G| (1.2e-4 at the extreme gate's
|G| <= 3840), far under a 16-bit rounding.

`pairs_kernel`: Akk = strictly_lower P(k, k), Aqk = lower P(q, k), float32 [B, T, H, BT].
`pair_grads_kernel`: given D = dL/dAqk and E = dL/dAkk (lower, float32, from the backward's
per-chunk kernels), adds their parts to dq, dk and dG, the gradient of G, in place, each program
to its block's rows (as rows of its pairs with earlier blocks and its own, as columns of later
blocks' and its own):
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
from fla_kernels.ops.common.tiles import (diagonal, head_program, load_row, load_rows, load_rows_t, row_block,
                                          store_rows)

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
    offs, m = row_block(base, t, T, H, K, BK, i_k)
    return tl.load(gc + offs, mask=m, other=0)


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
def _block_gates(gc, base, t0, T, H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                 i_k):
    """[BC, BK] cumulative gates of rows t0.. (zero past T), in gc's dtype."""
    t = t0 + tl.arange(0, BC)
    return cumgate_rows(gc, base, t, t < T, H, K, BK, i_k)


@triton.jit
def _pair_block(A, row, t0, T, H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, J,
                TRANSPOSED: tl.constexpr):
    """[BC, BC] float32 block of a pair matrix A [B, T, H, BT]: rows t0.. (zero past T), chunk
    columns J*BC.. (transposed with TRANSPOSED)."""
    if TRANSPOSED:
        return load_rows_t(A, row * BT, t0, T, H, BT, BC, BC, J)
    else:
        return load_rows(A, row * BT, t0, T, H, BT, BC, BC, J)


@triton.jit
def _block_span(gc, base, G, t0, T, H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr,
                BK: tl.constexpr, i_k):
    """(rise [BC, BK], fits): G_r - G of a block's rows t0.. (G their cumulative gates, r = t0
    the block's first row; zero past T), and whether it is at most SPLIT_SPAN everywhere, so
    that exp(G_t - G_s) splits at r as exp(-rise_t) exp(rise_s)."""
    t = t0 + tl.arange(0, BC)
    rise = tl.where((t < T)[:, None], cumgate_row(gc, base, t0, T, H, K, BK, i_k)[None, :] - G, 0.0)
    return rise, tl.max(tl.max(rise, axis=1), axis=0) <= SPLIT_SPAN


@triton.jit(do_not_specialize=["T"])
def pairs_kernel(q, k, gc, Akk, Aqk, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                 BC: tl.constexpr, BK: tl.constexpr, FP32_DOT: tl.constexpr):
    """Per chunk and block I of BC rows: rows I of Akk (strictly lower) and Aqk (lower)
    [B, T, H, BT] float32, a [BC, BC] block at a time, each summed over K a block of BK key
    columns at a time; the blocks right of the diagonal are zero.

    Block (I, J), J < I, with e the last row before I: (a_I exp(G_I - G_e)) (k_J exp(G_e -
    G_J))^T, both exponents <= 0. The diagonal block where its decay is at most SPLIT_SPAN
    in every channel: the exponent split at the block's first row r, exp(G_t - G_r)
    exp(G_r - G_s); past that it is summed a column at a time, every exponent <= 0."""
    NB: tl.constexpr = BT // BC
    I, i_c, _, _, _, row = head_program(T, H, NB, tl.cdiv(T, BT))
    base = row * K
    t0 = i_c * BT + I * BC
    r = tl.arange(0, BC)
    for J in range(0, I):
        s0 = i_c * BT + J * BC
        b_kk = tl.zeros([BC, BC], dtype=tl.float32)
        b_qk = tl.zeros([BC, BC], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            G_e = cumgate_row(gc, base, t0 - 1, T, H, K, BK, i_k)
            dec = decay(_block_gates(gc, base, t0, T, H, K, BC, BK, i_k) - G_e[None, :])
            s = s0 + r
            before = load_rows_t(k, base, s0, T, H, K, BC, BK, i_k) * decay(
                G_e[:, None] - cumgate_cols(gc, base, s, s < T, H, K, BK, i_k))
            b_kk += mma(load_rows(k, base, t0, T, H, K, BC, BK, i_k) * dec, before, FP32_DOT, tl.float32)
            b_qk += mma(load_rows(q, base, t0, T, H, K, BC, BK, i_k) * dec, before, FP32_DOT, tl.float32)
        store_rows(Akk, b_kk, row * BT, t0, T, H, BT, BC, BC, J)
        store_rows(Aqk, b_qk, row * BT, t0, T, H, BT, BC, BC, J)
    b_kk = tl.zeros([BC, BC], dtype=tl.float32)
    b_qk = tl.zeros([BC, BC], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_q = load_rows(q, base, t0, T, H, K, BC, BK, i_k)
        b_k = load_rows(k, base, t0, T, H, K, BC, BK, i_k)
        b_G = _block_gates(gc, base, t0, T, H, K, BC, BK, i_k)
        rise, fits = _block_span(gc, base, b_G, t0, T, H, K, BC, BK, i_k)
        if fits:
            fall = decay(-rise)
            up = tl.trans(b_k * tl.exp(rise.to(tl.float32)))
            b_kk += tl.where(r[:, None] > r[None, :], mma(b_k * fall, up, FP32_DOT, tl.float32), 0.0)
            b_qk += tl.where(r[:, None] >= r[None, :], mma(b_q * fall, up, FP32_DOT, tl.float32), 0.0)
        else:
            for j in range(BC):
                b_j = load_row(k, base, t0 + j, T, H, K, BK, i_k)
                dec = b_j[None, :] * decay(b_G - cumgate_row(gc, base, t0 + j, T, H, K, BK, i_k)[None, :])
                at = r[None, :] == j
                b_kk += tl.where(at & (r > j)[:, None], tl.sum(b_k * dec, axis=1)[:, None], 0.0)
                b_qk += tl.where(at & (r >= j)[:, None], tl.sum(b_q * dec, axis=1)[:, None], 0.0)
    store_rows(Akk, b_kk, row * BT, t0, T, H, BT, BC, BC, I)
    store_rows(Aqk, b_qk, row * BT, t0, T, H, BT, BC, BC, I)
    for J in range(I + 1, NB):
        store_rows(Akk, tl.zeros([BC, BC], dtype=tl.float32), row * BT, t0, T, H, BT, BC, BC, J)
        store_rows(Aqk, tl.zeros([BC, BC], dtype=tl.float32), row * BT, t0, T, H, BT, BC, BC, J)


@triton.jit
def _earlier_pairs(dAqk, dAkk, k, b_q, b_k, G, gc, row, base, c0, t0, I, T, H: tl.constexpr,
                   K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                   FP32_DOT: tl.constexpr, i_k):
    """(rq, rk, dG) [BC, BK] of block I's rows (t0..) against every earlier block J, e the last
    row before I: rq_t = sum_s D_ts k_s exp(G_t - G_s) through (D (k exp(G_e - G_s))) exp(G_t - G_e),
    rk the same of E, dG = q_t rq_t + k_t rk_t from the operands the products read."""
    G_e = cumgate_row(gc, base, t0 - 1, T, H, K, BK, i_k)
    X = decay(G - G_e[None, :])
    y_q = tl.zeros([BC, BK], dtype=tl.float32)
    y_k = tl.zeros([BC, BK], dtype=tl.float32)
    for J in range(0, I):
        s0 = c0 + J * BC
        kY = tf32_operand(load_rows(k, base, s0, T, H, K, BC, BK, i_k) * decay(
            G_e[None, :] - _block_gates(gc, base, s0, T, H, K, BC, BK, i_k)), FP32_DOT)
        D = tf32_operand(_pair_block(dAqk, row, t0, T, H, BT, BC, J, False), FP32_DOT)
        E = tf32_operand(_pair_block(dAkk, row, t0, T, H, BT, BC, J, False), FP32_DOT)
        y_q += mma(D, kY, FP32_DOT, tl.float32)
        y_k += mma(E, kY, FP32_DOT, tl.float32)
    dG = tf32_operand(b_q * X, FP32_DOT) * y_q + tf32_operand(b_k * X, FP32_DOT) * y_k
    return y_q * X, y_k * X, dG


@triton.jit
def _later_pairs(dAqk, dAkk, q, k, b_k, G, gc, row, base, c0, t0, I, T, H: tl.constexpr,
                 K: tl.constexpr, NB: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                 BK: tl.constexpr, FP32_DOT: tl.constexpr, i_k):
    """(c, dG) [BC, BK] of block I's rows (t0..) as columns of every later block L, e the last
    row before L: c_s = sum_t (D_ts q_t + E_ts k_t) exp(G_t - G_s) through
    (D^T (q exp(G_t - G_e)) + E^T (k exp(G_t - G_e))) exp(G_e - G_s), dG = -k_s c_s from the
    operands `_earlier_pairs` of block L reads: each pair's two sides of dG are the same product
    of the same rounded numbers (the module's note)."""
    c = tl.zeros([BC, BK], dtype=tl.float32)
    dG = tl.zeros([BC, BK], dtype=tl.float32)
    for L in range(I + 1, NB):
        u0 = c0 + L * BC
        G_e = cumgate_row(gc, base, u0 - 1, T, H, K, BK, i_k)
        X = decay(_block_gates(gc, base, u0, T, H, K, BC, BK, i_k) - G_e[None, :])
        qX = tf32_operand(load_rows(q, base, u0, T, H, K, BC, BK, i_k) * X, FP32_DOT)
        kX = tf32_operand(load_rows(k, base, u0, T, H, K, BC, BK, i_k) * X, FP32_DOT)
        Dt = tf32_operand(_pair_block(dAqk, row, u0, T, H, BT, BC, I, True), FP32_DOT)
        Et = tf32_operand(_pair_block(dAkk, row, u0, T, H, BT, BC, I, True), FP32_DOT)
        z = mma(Dt, qX, FP32_DOT, tl.float32) + mma(Et, kX, FP32_DOT, tl.float32)
        Y = decay(G_e[None, :] - G)
        c += z * Y
        dG -= tf32_operand(b_k * Y, FP32_DOT) * z
    return c, dG


@triton.jit
def _own_pairs(dAqk, dAkk, q, k, b_q, b_k, G, gc, row, base, c0, t0, I, T, H: tl.constexpr,
               K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
               FP32_DOT: tl.constexpr, i_k):
    """(rq, rk + c, dG) [BC, BK] of the pairs inside block I (rows t0..), off the diagonal: one
    product each way where the block's decay is at most SPLIT_SPAN (the exponent split at its
    first row), else a column at a time with every exponent <= 0."""
    r = tl.arange(0, BC)
    below, above = r[:, None] > r[None, :], r[:, None] < r[None, :]
    rise, fits = _block_span(gc, base, G, t0, T, H, K, BC, BK, i_k)
    if fits:
        fall, up = decay(-rise), tl.exp(rise.to(tl.float32))
        k_up = tf32_operand(b_k * up, FP32_DOT)
        q_fall, k_fall = tf32_operand(b_q * fall, FP32_DOT), tf32_operand(b_k * fall, FP32_DOT)
        D = tf32_operand(tl.where(below, _pair_block(dAqk, row, t0, T, H, BT, BC, I, False), 0.0), FP32_DOT)
        E = tf32_operand(tl.where(below, _pair_block(dAkk, row, t0, T, H, BT, BC, I, False), 0.0), FP32_DOT)
        Dt = tf32_operand(tl.where(above, _pair_block(dAqk, row, t0, T, H, BT, BC, I, True), 0.0), FP32_DOT)
        Et = tf32_operand(tl.where(above, _pair_block(dAkk, row, t0, T, H, BT, BC, I, True), 0.0), FP32_DOT)
        y_q = mma(D, k_up, FP32_DOT, tl.float32)
        y_k = mma(E, k_up, FP32_DOT, tl.float32)
        z = mma(Dt, q_fall, FP32_DOT, tl.float32) + mma(Et, k_fall, FP32_DOT, tl.float32)
        rq, rkc, dG = fall * y_q, fall * y_k + up * z, q_fall * y_q + k_fall * y_k - k_up * z
    else:
        sq = tl.zeros([BC, BK], dtype=tl.float32)
        sk = tl.zeros([BC, BK], dtype=tl.float32)
        sc = tl.zeros([BC, BK], dtype=tl.float32)
        rows = t0 - c0 + r
        for j in range(BC):
            k_j = load_row(k, base, t0 + j, T, H, K, BK, i_k)[None, :]
            q_j = load_row(q, base, t0 + j, T, H, K, BK, i_k)[None, :]
            diff = G - cumgate_row(gc, base, t0 + j, T, H, K, BK, i_k)[None, :]
            X = decay(tl.where((r > j)[:, None], diff, -diff))
            col = t0 - c0 + j
            d_q = pair_entries(dAqk, row, c0, rows, col, r > j, T, H, BT)[:, None]
            d_k = pair_entries(dAkk, row, c0, rows, col, r > j, T, H, BT)[:, None]
            sq += d_q * k_j * X
            sk += d_k * k_j * X
            c_q = pair_entries(dAqk, row, c0, col + 0 * r, rows, r < j, T, H, BT)[:, None]
            c_k = pair_entries(dAkk, row, c0, col + 0 * r, rows, r < j, T, H, BT)[:, None]
            sc += (c_q * q_j + c_k * k_j) * X
        rq, rkc, dG = sq, sk + sc, b_q * sq + b_k * (sk - sc)
    return rq, rkc, dG


@triton.jit(do_not_specialize=["T"])
def pair_grads_kernel(q, k, gc, dAqk, dAkk, dq, dk, dq_out, dk_out, dG, T, H: tl.constexpr, K: tl.constexpr,
                      BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, FP32_DOT: tl.constexpr):
    """Per chunk, block I of BC rows and block of BK key columns (each column's sums are its
    own): adds the pair matrices' parts to rows I of dq and dk [B, T, H, K] float32, stored whole
    in dq_out and dk_out (the dtype torch returns them in), and of dG float32 in place: the pairs
    of I's rows with earlier blocks, of its rows as columns of later blocks, and of
    the pairs inside I (the diagonal of D, ungated, through dd)."""
    NB: tl.constexpr = BT // BC
    i_kb, i_c, _, _, _, row = head_program(T, H, tl.cdiv(K, BK) * NB, tl.cdiv(T, BT))
    i_k, I = i_kb // NB, i_kb % NB
    base = row * K
    c0 = i_c * BT
    t0 = c0 + I * BC
    b_q = load_rows(q, base, t0, T, H, K, BC, BK, i_k)
    b_k = load_rows(k, base, t0, T, H, K, BC, BK, i_k)
    b_G = _block_gates(gc, base, t0, T, H, K, BC, BK, i_k)
    rq, rkc, pair_dG = _own_pairs(dAqk, dAkk, q, k, b_q, b_k, b_G, gc, row, base, c0, t0, I, T, H, K,
                                  BT, BC, BK, FP32_DOT, i_k)
    if I > 0:
        e_q, e_k, e_dG = _earlier_pairs(dAqk, dAkk, k, b_q, b_k, b_G, gc, row, base, c0, t0, I, T, H,
                                        K, BT, BC, BK, FP32_DOT, i_k)
        rq += e_q
        rkc += e_k
        pair_dG += e_dG
    if I < NB - 1:
        l_c, l_dG = _later_pairs(dAqk, dAkk, q, k, b_k, b_G, gc, row, base, c0, t0, I, T, H, K, NB,
                                 BT, BC, BK, FP32_DOT, i_k)
        rkc += l_c
        pair_dG += l_dG
    dd = diagonal(_pair_block(dAqk, row, t0, T, H, BT, BC, I, False), BC)[:, None]
    b_dq = load_rows(dq, base, t0, T, H, K, BC, BK, i_k) + rq + dd * b_k
    b_dk = load_rows(dk, base, t0, T, H, K, BC, BK, i_k) + rkc + dd * b_q
    store_rows(dq_out, b_dq, base, t0, T, H, K, BC, BK, i_k)
    store_rows(dk_out, b_dk, base, t0, T, H, K, BC, BK, i_k)
    b_dG = load_rows(dG, base, t0, T, H, K, BC, BK, i_k) + pair_dG
    store_rows(dG, b_dG, base, t0, T, H, K, BC, BK, i_k)
