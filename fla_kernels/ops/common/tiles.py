"""Tile loads and stores shared by the chunked kernels ([B, T, H, D] sequence-first tensors), and
where a program of a `flat_grid` launch (launch.py) works.

Every load returns float32 at once (zero outside the tensor); offsets are int64.
"""
import triton
import triton.language as tl


@triton.jit
def flat_program(N0, N1):
    """(i_0, i_1, i_bh) of a program on a grid from `flat_grid(N0, N1, heads)` (launch.py): its
    indices, fastest first; i_0, i_1 int32, i_bh int64."""
    pid = tl.program_id(1).to(tl.int64) * tl.num_programs(0) + tl.program_id(0)
    i_01 = (pid % (N0 * N1)).to(tl.int32)
    return i_01 % N0, i_01 // N0, pid // (N0 * N1)


@triton.jit
def flat_heads(N0, N1):
    """How many (batch, head) indices the launch of `flat_program(N0, N1)` holds (int64)."""
    return tl.num_programs(0).to(tl.int64) * tl.num_programs(1) // (N0 * N1)


@triton.jit
def head_program(T, H: tl.constexpr, N0, N1):
    """(i_0, i_1, i_bh, i_b, i_h, row) of a program on a grid `flat_grid(N0, N1, B * H)`: its
    first two indices (`flat_program`), its batch and head (i_bh = b * H + h, int64) and
    row = b * T * H + h, the first row of (b, h) in a [B, T, H, D] tensor (its offset there is
    row * D)."""
    i_0, i_1, i_bh = flat_program(N0, N1)
    i_b, i_h = i_bh // H, i_bh % H
    return i_0, i_1, i_bh, i_b, i_h, i_b * T * H + i_h


@triton.jit
def load_rows(x, base, t0, T, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
              BD: tl.constexpr, i_d):
    """[BR, BD] float32 tile of x [B, T, H, D] at rows t0.., columns i_d*BD.. (zero outside)."""
    return load_stored(x, base, t0, T, H, D, BR, BD, i_d, False).to(tl.float32)


@triton.jit
def load_stored(x, base, t0, T, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
                BD: tl.constexpr, i_d, TRANSPOSED: tl.constexpr):
    """The tile of `load_rows` (with TRANSPOSED of `load_rows_t`) in x's own dtype: an fp16
    operand tile as a product takes it."""
    t = t0 + tl.arange(0, BR)
    d = i_d * BD + tl.arange(0, BD)
    if TRANSPOSED:
        offs = base + t.to(tl.int64)[None, :] * (H * D) + d[:, None]
        mask = (t[None, :] < T) & (d[:, None] < D)
    else:
        offs = base + t.to(tl.int64)[:, None] * (H * D) + d[None, :]
        mask = (t[:, None] < T) & (d[None, :] < D)
    return tl.load(x + offs, mask=mask, other=0)


@triton.jit
def load_chunk_rows(x, base, c0, lo, hi, T, H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr,
                    BD: tl.constexpr, i_d):
    """[BT, BD] float32 tile of the chunk at c0 holding only its rows lo <= r < hi (zero elsewhere
    and past T): the rows a program needs, at the positions where the whole chunk would hold them."""
    r = tl.arange(0, BT)
    t = c0 + r
    d = i_d * BD + tl.arange(0, BD)
    offs = base + t.to(tl.int64)[:, None] * (H * D) + d[None, :]
    m_t = (r >= lo) & (r < hi) & (t < T)
    return tl.load(x + offs, mask=m_t[:, None] & (d[None, :] < D), other=0).to(tl.float32)


@triton.jit
def load_rows_t(x, base, t0, T, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
                BD: tl.constexpr, i_d):
    """The same tile as `load_rows`, read transposed: [BD, BR]."""
    return load_stored(x, base, t0, T, H, D, BR, BD, i_d, True).to(tl.float32)


@triton.jit
def row_block(base, t, T, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, i_d):
    """(offsets, mask) of row t, columns i_d*BD.., of a [B, T, H, D] tensor (masked past T)."""
    d = i_d * BD + tl.arange(0, BD)
    # a scalar bool and'ed with a vector one trips the triton 3.9 interpreter: fold t < T into the bound
    return base + t.to(tl.int64) * (H * D) + d, d < tl.where(t < T, D, 0)


@triton.jit
def load_row(x, base, t, T, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, i_d):
    """[BD] float32 row of x [B, T, H, D] at time t (zero past T)."""
    offs, m = row_block(base, t, T, H, D, BD, i_d)
    return tl.load(x + offs, mask=m, other=0).to(tl.float32)


@triton.jit
def store_row(x, val, base, t, T, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, i_d):
    """Store a [BD] row into x [B, T, H, D] at time t (nothing past T), in x's dtype."""
    offs, m = row_block(base, t, T, H, D, BD, i_d)
    tl.store(x + offs, val.to(x.dtype.element_ty), mask=m)


@triton.jit
def gather_rows(x, base, t, m_t, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, i_d):
    """[len(t), BD] float32 rows t of x [B, T, H, D] where m_t holds (zero elsewhere)."""
    d = i_d * BD + tl.arange(0, BD)
    offs = base + t.to(tl.int64)[:, None] * (H * D) + d[None, :]
    return tl.load(x + offs, mask=m_t[:, None] & (d[None, :] < D), other=0).to(tl.float32)


@triton.jit
def store_rows(x, val, base, t0, T, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
               BD: tl.constexpr, i_d):
    """Store a [BR, BD] tile into x [B, T, H, D] at rows t0.., in x's dtype."""
    t = t0 + tl.arange(0, BR)
    d = i_d * BD + tl.arange(0, BD)
    offs = base + t.to(tl.int64)[:, None] * (H * D) + d[None, :]
    tl.store(x + offs, val.to(x.dtype.element_ty), mask=(t[:, None] < T) & (d[None, :] < D))


@triton.jit
def _state_block(index, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 i_k, i_v, TRANSPOSED: tl.constexpr):
    """(offsets, mask) of a [BK, BV] block (or [BV, BK] with TRANSPOSED) of [K, V] matrix `index`."""
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    if TRANSPOSED:
        offs = o_k[None, :] * V + o_v[:, None]
        mask = (o_k[None, :] < K) & (o_v[:, None] < V)
    else:
        offs = o_k[:, None] * V + o_v[None, :]
        mask = (o_k[:, None] < K) & (o_v[None, :] < V)
    return index.to(tl.int64) * (K * V) + offs, mask


@triton.jit
def load_state(s, index, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
               i_k, i_v, TRANSPOSED: tl.constexpr):
    """[BK, BV] float32 block (or [BV, BK] with TRANSPOSED) of the [K, V] matrix number `index`."""
    offs, mask = _state_block(index, K, V, BK, BV, i_k, i_v, TRANSPOSED)
    return tl.load(s + offs, mask=mask, other=0).to(tl.float32)


@triton.jit
def store_state(s, index, val, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, i_k, i_v, TRANSPOSED: tl.constexpr):
    """Store a [BK, BV] block (or [BV, BK] with TRANSPOSED) into the [K, V] matrix number `index`."""
    offs, mask = _state_block(index, K, V, BK, BV, i_k, i_v, TRANSPOSED)
    tl.store(s + offs, val.to(s.dtype.element_ty), mask=mask)


@triton.jit
def initial_block(h0, index, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  i_k, i_v, USE_H0: tl.constexpr, TRANSPOSED: tl.constexpr):
    """The float32 [BK, BV] block (or [BV, BK] with TRANSPOSED) of the state a walk over the
    chunks starts from: the [K, V] matrix number `index` of h0 with USE_H0, else zeros."""
    if TRANSPOSED:
        b_h = tl.zeros([BV, BK], dtype=tl.float32)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += load_state(h0, index, K, V, BK, BV, i_k, i_v, TRANSPOSED)
    return b_h


@triton.jit
def diagonal(b_A, BR: tl.constexpr):
    """[BR] the diagonal of a [BR, BR] tile."""
    o_i = tl.arange(0, BR)
    return tl.sum(tl.where(o_i[:, None] == o_i[None, :], b_A, 0.0), axis=1)
