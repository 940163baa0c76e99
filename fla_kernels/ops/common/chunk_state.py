"""Chunk-level building blocks for the state recurrence S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t.

Shared by every op family whose state [K, V] per (batch, head) follows that
recurrence with a per-channel log gate g [B, T, H, K] (gla, rwkv6) or no gate
at all (linear attention). Time is cut into chunks of BT tokens, and chunks
into gate blocks of GS tokens (GS divides BT; 16 for the sub-chunks of the
intra-chunk products).

Gates. Every exponent the kernels take is a sum of gates, all <= 0, never a
difference of two large cumulative sums: with strong decay (g = -60 per step, a
chunk sums to -3840) a difference G_i - G_j of chunk-wide cumsums would lose about
eps * 3840 of absolute precision, which the gradient of the gate feels. A kernel
sums the gates it needs itself, as one masked product on the tensor cores
(`span_sums`): a 0/1 selection [R, BR] times the gate rows [BR, BK]. The operands
hold g exactly (its own 16-bit dtype, or IEEE fp32), so every term is exact and
only the fp32 accumulation rounds. Within a chunk (`chunk_gate_sums`):
    prefix_i = sum_{s < i} g_s (or s <= i)
    suffix_j = sum_{s > j} g_s
    total    = sum_s g_s
Positions past T count as zero gates. `gates_from` / `gates_after` take the
same sums over any span of a loaded chunk tile (gated slot attention's
cross-sub-chunk factors). The fused chunk form of gla reads stored per-block
sums instead: `block_gate_sums` stores, per gate block of GS rows, the
inclusive prefix P and the exclusive suffix Q.

A scalar gate (simple GLA: one log decay per head and step, g [B, T, H], the same for
every K column) needs no stored sums: `scalar_gate_tiles` takes the chunk-local
cumsum in float64 (BT values per program), whose differences keep full float32
precision however strong the decay.

Kernels:
- `chunk_fwd_h`: the states entering every chunk, stored in the caller's
  `state_dtype` (16 bits where the next product rounds them to 16-bit operands
  anyway: half the traffic), and the final state (always float32).
- `chunk_bwd_dh`: the gradient w.r.t. the state leaving every chunk and w.r.t.
  the initial state, for outputs o_t = scale q_t S_{t-1} (rwkv6:
  `q_gate_exclusive=True`) or o_t = scale q_t S_t (gla).
Given the chunk offsets of a packed batch's sequences on its aligned row (ops/common/varlen.py),
both walk each sequence's chunks on their own, from its initial state (or the gradient of its
final state) to its final state (or the gradient of its initial state).

Every kernel loads its operands as float32 right away; matrix products go
through `mma`, so fp32 inputs get exact IEEE products and bf16 / fp16 inputs
tensor-core operands of their own dtype, except a walk's decayed or scaled rows, which
are computed and enter as rounded tf32 (`_walk_step`). Offsets are int64.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.dot import EMULATE, add_rounded, mma, mma_tf32_split_rhs
from fla_kernels.ops.common.launch import block_size, flat_grid, launch, tuned_blocks
from fla_kernels.ops.common.tiles import (flat_program, initial_block, load_rows, load_state,
                                          store_state)
from fla_kernels.ops.common.varlen import sequence_walk, state_count


@triton.jit
def exp_nonpos(x):
    """exp(x) for an argument that is <= 0 by construction.

    The clamp only absorbs rounding (a tree-ordered cumsum need not be exactly
    monotone); it guarantees that no exponential anywhere exceeds 1.
    """
    return tl.exp(tl.minimum(x, 0.0))


# ----------------------------------------------------------------------------- gate sums

@triton.jit(do_not_specialize=["T"])
def _block_gate_sums_kernel(g, P, Q, T, H: tl.constexpr, K: tl.constexpr,
                            GS: tl.constexpr, BK: tl.constexpr):
    """P[t] = sum of g over t's block up to t inclusive; Q[t] = sum over t's block after t."""
    i_k, i_s, i_bh = flat_program(tl.cdiv(K, BK), tl.cdiv(T, GS))
    i_b, i_h = i_bh // H, i_bh % H
    t = i_s * GS + tl.arange(0, GS)
    d = i_k * BK + tl.arange(0, BK)
    m_d = d[None, :] < K
    base = (i_b * T * H + i_h) * K + d[None, :]
    offs = base + t.to(tl.int64)[:, None] * (H * K)
    mask = (t[:, None] < T) & m_d
    b_g = tl.load(g + offs, mask=mask, other=0).to(tl.float32)
    # g one row down (zero past the block): its reverse cumsum is the exclusive suffix
    m_next = ((t + 1 < T) & (tl.arange(0, GS) < GS - 1))[:, None] & m_d
    b_gn = tl.load(g + offs + H * K, mask=m_next, other=0).to(tl.float32)
    tl.store(P + offs, tl.cumsum(b_g, axis=0), mask=mask)
    tl.store(Q + offs, tl.cumsum(b_gn, axis=0, reverse=True), mask=mask)


def block_gate_sums(g: torch.Tensor, block: int):
    """(P, Q), float32 [B, T, H, K]: the inclusive prefix and exclusive suffix sums of g
    within blocks of `block` rows."""
    B, T, H, K = g.shape
    P = torch.empty(B, T, H, K, dtype=torch.float32, device=g.device)
    Q = torch.empty_like(P)
    BK = block_size(K)
    grid = flat_grid(triton.cdiv(K, BK), triton.cdiv(T, block), B * H)
    launch(_block_gate_sums_kernel, grid, g, P, Q, T, H, K, GS=block, BK=BK)
    return P, Q


@triton.jit
def _prefix_source(t, T, GS: tl.constexpr, EXCLUSIVE: tl.constexpr):
    """(src, ok): the row(s) of P holding the prefix at time(s) t, and where it is not zero: the
    row before with EXCLUSIVE (zero at a block start), else t itself (zero past T)."""
    if EXCLUSIVE:
        return t - 1, (t % GS != 0) & (t <= T)
    else:
        return t, t < T


@triton.jit
def load_prefix(P, base, t0, T, H: tl.constexpr, K: tl.constexpr, BR: tl.constexpr,
                BK: tl.constexpr, i_k, GS: tl.constexpr, EXCLUSIVE: tl.constexpr):
    """[BR, BK] block-local prefix sums of the gate at rows t0.. (zero past T).

    EXCLUSIVE reads P one row up (zero at a block start), so the exclusive
    prefix at i equals the inclusive one at i - 1 bit for bit.
    """
    t = t0 + tl.arange(0, BR)
    d = i_k * BK + tl.arange(0, BK)
    src, m_t = _prefix_source(t, T, GS, EXCLUSIVE)
    offs = base + src.to(tl.int64)[:, None] * (H * K) + d[None, :]
    return tl.load(P + offs, mask=m_t[:, None] & (d[None, :] < K), other=0)


@triton.jit
def load_prefix_row(P, base, t, T, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, i_k,
                    GS: tl.constexpr, EXCLUSIVE: tl.constexpr):
    """[BK] row of `load_prefix` at time t."""
    d = i_k * BK + tl.arange(0, BK)
    src, ok = _prefix_source(t, T, GS, EXCLUSIVE)
    # (a scalar mask and'ed with a vector one trips the triton 3.9 interpreter: fold it into the bound)
    return tl.load(P + base + src.to(tl.int64) * (H * K) + d, mask=d < tl.where(ok, K, 0), other=0)


@triton.jit
def block_total(P, base, b0, T, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, i_k,
                GS: tl.constexpr):
    """[BK] sum of the gate over the block starting at b0 (zero if it starts past T)."""
    d = i_k * BK + tl.arange(0, BK)
    src = tl.minimum(b0 + GS - 1, T - 1)
    return tl.load(P + base + src.to(tl.int64) * (H * K) + d, mask=d < tl.where(b0 < T, K, 0), other=0)


@triton.jit
def _level_split(b_f, BC: tl.constexpr, S: tl.constexpr):
    """(f_row, f_col, pairs) of level S from the factors b_f [BC, BK] of every row: a row's factor
    is a row factor in the upper half of its group of 2S rows and a column factor in the lower
    one; pairs [BC, BC] holds (i upper, j lower) of one group."""
    o = tl.arange(0, BC)
    upper = ((o & S) != 0)[:, None]
    pairs = upper & ((o[None, :] & S) == 0) & ((o[:, None] ^ o[None, :]) < 2 * S)
    return tl.where(upper, b_f, 0.0), tl.where(upper, 0.0, b_f), pairs


@triton.jit
def span_sums(b_g, first, end, BR: tl.constexpr, FP32_DOT: tl.constexpr, GATE_DTYPE: tl.constexpr):
    """[R, BK]: row r is the sum of the gate rows first[r] <= s < end[r] of b_g [BR, BK] (zero
    when the span is empty), as one product of a 0/1 selection and the gates.

    b_g holds values of GATE_DTYPE (the gate tensor's element type), which the operands keep
    exactly: its own 16-bit type on the tensor cores, IEEE fp32 for fp32 gates or with FP32_DOT.
    Every term is then exact and only the fp32 accumulation rounds: a sum of non-positive terms,
    exact to a few ulps of itself, never a difference of two larger sums.
    """
    s = tl.arange(0, BR)[None, :]
    sel = (s >= first[:, None]) & (s < end[:, None])
    IEEE: tl.constexpr = FP32_DOT or EMULATE or GATE_DTYPE == tl.float32
    return mma(sel.to(tl.float32), b_g, IEEE, GATE_DTYPE)


@triton.jit
def diag_level_sums(b_g, off, BR: tl.constexpr, BC: tl.constexpr, S: tl.constexpr,
                    EXCLUSIVE: tl.constexpr, FP32_DOT: tl.constexpr, GATE_DTYPE: tl.constexpr):
    """(f_row, f_col [BC, BK], pairs [BC, BC]): level S of the pairs of the gate block held in
    rows off..off+BC-1 of b_g [BR, BK] (zero past T).

    Level S holds the pairs (i, j) whose block indices first differ in bit S: i in the upper half
    of an aligned group of 2S rows, j in its lower half. The pair decays by the gates after j up
    to i (to i - 1 with EXCLUSIVE: rwkv6), which the half boundary splits in two: from the first
    row of i's half to i, and from j + 1 to the last row of j's half, both sums of the block's own
    gates (`span_sums`) and <= 0. f_row is 0 off the upper halves, f_col off the lower ones:
    summed over the levels (four for BC = 16), the pair products of the diagonal block become
    small dots with BC * BK exponentials per level instead of a [BC, BC, BK] cube.
    """
    o = tl.arange(0, BC)
    upper = (o & S) != 0
    first = tl.where(upper, o & -S, o + 1)
    if EXCLUSIVE:
        end = tl.where(upper, o, (o | (S - 1)) + 1)
    else:
        end = tl.where(upper, o + 1, (o | (S - 1)) + 1)
    b_f = exp_nonpos(span_sums(b_g, off + first, off + end, BR, FP32_DOT, GATE_DTYPE))
    return _level_split(b_f, BC, S)


@triton.jit
def gates_from(b_g, start, r0, BR: tl.constexpr, R: tl.constexpr, EXCLUSIVE: tl.constexpr,
               FP32_DOT: tl.constexpr, GATE_DTYPE: tl.constexpr):
    """[R, BK] the sum of the gate rows of b_g [BR, BK] from row `start` through each row
    r0..r0+R-1 (up to the row before it with EXCLUSIVE; zero where that span is empty)."""
    o = r0 + tl.arange(0, R)
    first = tl.zeros([R], dtype=tl.int32) + start
    if EXCLUSIVE:
        return span_sums(b_g, first, o, BR, FP32_DOT, GATE_DTYPE)
    else:
        return span_sums(b_g, first, o + 1, BR, FP32_DOT, GATE_DTYPE)


@triton.jit
def gates_after(b_g, r0, end, BR: tl.constexpr, R: tl.constexpr, FP32_DOT: tl.constexpr,
                GATE_DTYPE: tl.constexpr):
    """[R, BK] the sum of the gate rows of b_g [BR, BK] after each row r0..r0+R-1 up to the row
    before `end` (zero where that span is empty)."""
    o = r0 + tl.arange(0, R)
    return span_sums(b_g, o + 1, tl.zeros([R], dtype=tl.int32) + end, BR, FP32_DOT, GATE_DTYPE)


@triton.jit
def chunk_gate_sums(g, base, c0, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                    BK: tl.constexpr, i_k, PREFIX_EXCLUSIVE: tl.constexpr, FP32_DOT: tl.constexpr):
    """Gate sums of the chunk starting at c0, from the gate g [B, T, H, K] itself (`span_sums`).

    Returns prefix [BT, BK] (sum of g from the chunk start up to each row, exclusive with
    PREFIX_EXCLUSIVE), suffix [BT, BK] (sum of g after each row to the chunk end) and total
    [BK]; every one a sum of values <= 0.
    """
    b_g = load_rows(g, base, c0, T, H, K, BT, BK, i_k)
    GATE_DTYPE: tl.constexpr = g.dtype.element_ty
    prefix = gates_from(b_g, 0, 0, BT, BT, PREFIX_EXCLUSIVE, FP32_DOT, GATE_DTYPE)
    suffix = gates_after(b_g, 0, BT, BT, BT, FP32_DOT, GATE_DTYPE)
    return prefix, suffix, tl.sum(b_g, axis=0)


@triton.jit
def scalar_gate_rows(g, i_b, i_h, c0, T, H: tl.constexpr, BT: tl.constexpr):
    """[BT] float64: the scalar gate g [B, T, H] at rows c0.. (zero past T)."""
    t = c0 + tl.arange(0, BT)
    return tl.load(g + (i_b * T + t.to(tl.int64)) * H + i_h, mask=t < T, other=0).to(tl.float64)


@triton.jit
def chunk_cumgate(g, i_b, i_h, c0, T, H: tl.constexpr, BT: tl.constexpr):
    """(G [BT] float64, G_L scalar float64): the inclusive chunk-local cumsum of the scalar gate
    g [B, T, H] from c0 (zero gates past T) and its value at the chunk's last row."""
    b_G = tl.cumsum(scalar_gate_rows(g, i_b, i_h, c0, T, H, BT), axis=0)
    # the last element itself (padded gates are zero): G_L - G_L is exactly 0
    b_GL = tl.sum(tl.where(tl.arange(0, BT) == BT - 1, b_G, 0.0), axis=0)
    return b_G, b_GL


@triton.jit
def scalar_gate_tiles(g, i_b, i_h, c0, T, H: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                      PREFIX_EXCLUSIVE: tl.constexpr):
    """`chunk_gate_sums` for a scalar gate g [B, T, H], broadcast over BK columns: prefix and
    suffix [BT, BK], total [BK], from the float64 chunk-local cumsum (differences of it are
    exact to float32)."""
    b_G, b_GL = chunk_cumgate(g, i_b, i_h, c0, T, H, BT)
    if PREFIX_EXCLUSIVE:
        b_pre = b_G - scalar_gate_rows(g, i_b, i_h, c0, T, H, BT)
    else:
        b_pre = b_G
    zeros = tl.zeros([BT, BK], dtype=tl.float32)
    prefix = zeros + b_pre.to(tl.float32)[:, None]
    suffix = zeros + (b_GL - b_G).to(tl.float32)[:, None]
    total = tl.zeros([BK], dtype=tl.float32) + b_GL.to(tl.float32)
    return prefix, suffix, total


# ----------------------------------------------------------------------------- states

@triton.jit
def _walk_step(b_h, x, y, g, scale, row, i_b, i_h, c0, T, H: tl.constexpr, K: tl.constexpr,
               V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, i_k, i_v,
               USE_G: tl.constexpr, SCALAR_GATE: tl.constexpr, PREFIX: tl.constexpr,
               PREFIX_EXCLUSIVE: tl.constexpr, SCALED: tl.constexpr, FP32_DOT: tl.constexpr,
               OPERAND_DTYPE: tl.constexpr):
    """The [BK, BV] block b_h of a state (or state gradient) carried over the chunk at c0:
    diag(exp(total)) b_h + (x * exp(part))^T y, x [B, T, H, K] and y [B, T, H, V] read at the
    program's `row`, part the gate sums up to each row (PREFIX, exclusive with PREFIX_EXCLUSIVE)
    or after it, taken from g [B, T, H, K] (`chunk_gate_sums`) or, with SCALAR_GATE, g [B, T, H]
    (`scalar_gate_tiles`); no decay without USE_G; x times scale too with SCALED.

    A decayed or scaled x is a computed operand: it enters the product as rounded tf32 (10 bits,
    float32's range), not in the inputs' 16-bit dtype. One bf16 rounding of k * exp(suffix) per
    term put the final state at 1.2 times its bound (gla and rwkv6, K = V = 256, T = 64, strong
    decay, packed: the float32 baseline keeps it); tf32 brings it to 0.3."""
    b_x = load_rows(x, row * K, c0, T, H, K, BT, BK, i_k)
    if USE_G:
        if SCALAR_GATE:
            b_pre, b_suf, b_tot = scalar_gate_tiles(g, i_b, i_h, c0, T, H, BT, BK, PREFIX_EXCLUSIVE)
        else:
            b_pre, b_suf, b_tot = chunk_gate_sums(g, row * K, c0, T, H, K, BT, BK, i_k,
                                                  PREFIX_EXCLUSIVE, FP32_DOT)
        if PREFIX:
            b_x = b_x * exp_nonpos(b_pre)
        else:
            b_x = b_x * exp_nonpos(b_suf)
        b_h = b_h * exp_nonpos(b_tot)[:, None]
    if SCALED:
        b_x = b_x * scale
    b_y = load_rows(y, row * V, c0, T, H, V, BT, BV, i_v)
    if USE_G or SCALED:
        b_p = mma(tl.trans(b_x), b_y, FP32_DOT, tl.float32)
    else:
        b_p = mma(tl.trans(b_x), b_y, FP32_DOT, OPERAND_DTYPE)
    return add_rounded(b_h, b_p)


@triton.jit
def _walk_program(chunk_offsets, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, VARLEN: tl.constexpr):
    """(i_k, i_v, i_bh, i_b, i_h, row, i_row, c_lo, c_hi) of a state walk's program on the grid
    flat_grid(K-blocks, V-blocks, B * H), or flat_grid(K-blocks, V-blocks, N * H) with VARLEN
    (i_bh = n*H + h, `sequence_walk`): row, the first row of (i_b, i_h) in a [B, T, H, D] tensor
    (as `head_program`)."""
    i_k, i_v, i_bh = flat_program(tl.cdiv(K, BK), tl.cdiv(V, BV))
    i_b, i_h, i_row, c_lo, c_hi = sequence_walk(chunk_offsets, i_bh, NT, H, VARLEN)
    return i_k, i_v, i_bh, i_b, i_h, i_b * T * H + i_h, i_row, c_lo, c_hi


@triton.jit(do_not_specialize=["T", "NT"])
def _chunk_fwd_h_kernel(k, v, g, h0, states, final, chunk_offsets, T, NT, H: tl.constexpr,
                        K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                        BV: tl.constexpr, USE_G: tl.constexpr, SCALAR_GATE: tl.constexpr,
                        USE_H0: tl.constexpr, VARLEN: tl.constexpr, FP32_DOT: tl.constexpr,
                        OPERAND_DTYPE: tl.constexpr):
    """states[b, h, c] = state entering chunk c (in states' dtype); final[b, h] = final state.

    One program per (K-block, V-block, b*h) walks the chunks in order, the state in float32:
    h <- diag(exp(total)) h + (k * exp(suffix))^T v (`_walk_step`). With VARLEN one program per
    (K-block, V-block, n*H + h) walks the chunks of sequence n, from h0[n] to final[n].
    """
    i_k, i_v, i_bh, i_b, i_h, row, i_row, c_lo, c_hi = _walk_program(chunk_offsets, T, NT, H, K,
                                                                      V, BK, BV, VARLEN)
    b_h = initial_block(h0, i_bh, K, V, BK, BV, i_k, i_v, USE_H0, False)
    for i_c in range(c_lo, c_hi):
        store_state(states, i_row * NT + i_c, b_h, K, V, BK, BV, i_k, i_v, False)
        b_h = _walk_step(b_h, k, v, g, 1.0, row, i_b, i_h, i_c * BT, T, H, K, V, BT, BK, BV, i_k,
                         i_v, USE_G, SCALAR_GATE, False, True, False, FP32_DOT, OPERAND_DTYPE)
    store_state(final, i_bh, b_h, K, V, BK, BV, i_k, i_v, False)


@triton.jit
def through_states(do, v, states, dh, base_v, index, c0, T, H: tl.constexpr, K: tl.constexpr,
                   V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, i_k,
                   i_v, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr,
                   SPLIT_DH: tl.constexpr):
    """(do, v [BT, BV], do h^T, v dh^T [BT, BK], sum over the V-block of h * dh [BK]) for V-block
    i_v of the chunk at c0: the parts of dq and dk through the state h entering the chunk and
    the gradient dh of the one leaving it (states[index], dh[index], [K, V], read transposed),
    and of the chunk's boundary term of dg.

    SPLIT_DH: v dh^T keeps about 21 bits of a float32 dh (`mma_tf32_split_rhs`). The rows'
    k_j . dk_j are the boundary term of dg at the chunk's last rows, where nothing cancels them:
    one 16-bit rounding of dh, shared by every row, put that dg at 1.3 times its bound (gla, bf16
    with float32 gates, a packed sequence's last chunk, dh its final state's float32 gradient)."""
    b_do = load_rows(do, base_v, c0, T, H, V, BT, BV, i_v)
    b_v = load_rows(v, base_v, c0, T, H, V, BT, BV, i_v)
    b_ht = load_state(states, index, K, V, BK, BV, i_k, i_v, True)
    b_dht = load_state(dh, index, K, V, BK, BV, i_k, i_v, True)
    if SPLIT_DH:
        b_dk = mma_tf32_split_rhs(b_v, b_dht, FP32_DOT)
    else:
        b_dk = mma(b_v, b_dht, FP32_DOT, OPERAND_DTYPE)
    return (b_do, b_v, mma(b_do, b_ht, FP32_DOT, OPERAND_DTYPE), b_dk,
            tl.sum(b_ht * b_dht, axis=0))


def _gate_args(g, stand_in):
    """(g or stand_in, USE_G, SCALAR_GATE) for the state kernels (see `chunk_fwd_h`)."""
    if g is None:
        return stand_in, False, False
    return g, True, g.dim() == 3


def chunk_fwd_h(k, v, g, initial_state, chunk_size, fp32_dot, operand_dtype,
                state_dtype=torch.float32, tuning=None, chunk_offsets=None):
    """(states [B, H, NT, K, V] in state_dtype: the state entering each of the NT chunks,
    final state [B, H, K, V] float32).

    g: the log gate, per channel [B, T, H, K] or scalar [B, T, H] (one log decay per head and
    step for every K column), or None for no decay; the kernel sums it per chunk itself.
    tuning: the caller's block caps and launch options (`tuned_blocks`). chunk_offsets: None, or
    the chunk offsets [N + 1] of the sequences of a packed batch on its aligned row (B = 1,
    ops/common/varlen.py), whose states are walked one sequence at a time: initial_state and the
    final state are then [N, H, K, V].
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    N = state_count(B, chunk_offsets)
    states = torch.empty(B, H, NT, K, V, dtype=state_dtype, device=k.device)
    final = torch.empty(N, H, K, V, dtype=torch.float32, device=k.device)
    BK, BV, options = tuned_blocks(K, V, tuning)
    g, use_g, scalar_gate = _gate_args(g, k)
    grid = flat_grid(triton.cdiv(K, BK), triton.cdiv(V, BV), N * H)
    launch(_chunk_fwd_h_kernel, grid,
        k, v, g, k if initial_state is None else initial_state, states, final, chunk_offsets, T,
        NT, H, K, V, BT=chunk_size, BK=BK, BV=BV, USE_G=use_g, SCALAR_GATE=scalar_gate,
        USE_H0=initial_state is not None, VARLEN=chunk_offsets is not None, FP32_DOT=fp32_dot,
        OPERAND_DTYPE=operand_dtype, **options)
    return states, final


@triton.jit(do_not_specialize=["T", "NT"])
def _chunk_bwd_dh_kernel(q, g, do, dht, dh, dh0, chunk_offsets, scale, T, NT, H: tl.constexpr,
                         K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr,
                         SCALAR_GATE: tl.constexpr, Q_GATE_EXCLUSIVE: tl.constexpr, USE_DHT: tl.constexpr,
                         STORE_DH0: tl.constexpr, VARLEN: tl.constexpr, FP32_DOT: tl.constexpr,
                         OPERAND_DTYPE: tl.constexpr):
    """dh[b, h, c] = dLoss / d(state leaving chunk c); dh0 = dLoss / d(initial state).

    One program per (K-block, V-block, b*h) walks the chunks backwards:
    dh <- diag(exp(total)) dh + scale * (q * exp(prefix))^T do, with the prefix
    exclusive (the output reads the state before the step) or inclusive (`_walk_step`).
    With VARLEN one program per (K-block, V-block, n*H + h) walks sequence n's chunks, from
    dht[n] to dh0[n].
    """
    i_k, i_v, i_bh, i_b, i_h, row, i_row, c_lo, c_hi = _walk_program(chunk_offsets, T, NT, H, K,
                                                                      V, BK, BV, VARLEN)
    b_dh = initial_block(dht, i_bh, K, V, BK, BV, i_k, i_v, USE_DHT, False)
    for i_r in range(c_hi - c_lo):
        i_c = c_hi - 1 - i_r
        store_state(dh, i_row * NT + i_c, b_dh, K, V, BK, BV, i_k, i_v, False)
        b_dh = _walk_step(b_dh, q, do, g, scale, row, i_b, i_h, i_c * BT, T, H, K, V, BT, BK, BV,
                          i_k, i_v, USE_G, SCALAR_GATE, True, Q_GATE_EXCLUSIVE, True, FP32_DOT,
                          OPERAND_DTYPE)
    if STORE_DH0:
        store_state(dh0, i_bh, b_dh, K, V, BK, BV, i_k, i_v, False)


def chunk_bwd_dh(q, g, do, dht, scale, chunk_size, q_gate_exclusive, need_dh0,
                 fp32_dot, operand_dtype, state_dtype=torch.float32, tuning=None,
                 chunk_offsets=None):
    """(dh [B, H, NT, K, V] in state_dtype, dh0 [B, H, K, V] float32 or None).

    dh[:, :, c] is the total gradient w.r.t. the state leaving chunk c (dht for
    the last chunk, zero when dht is None). g, tuning, chunk_offsets: as for `chunk_fwd_h`
    (with chunk_offsets dht and dh0 are [N, H, K, V], and dh[:, :, c] is dht[n] for the last
    chunk of sequence n).
    """
    B, T, H, K = q.shape
    V = do.shape[-1]
    NT = triton.cdiv(T, chunk_size)
    N = state_count(B, chunk_offsets)
    dh = torch.empty(B, H, NT, K, V, dtype=state_dtype, device=q.device)
    dh0 = torch.empty(N, H, K, V, dtype=torch.float32, device=q.device) if need_dh0 else None
    BK, BV, options = tuned_blocks(K, V, tuning)
    g, use_g, scalar_gate = _gate_args(g, q)
    grid = flat_grid(triton.cdiv(K, BK), triton.cdiv(V, BV), N * H)
    launch(_chunk_bwd_dh_kernel, grid,
        q, g, do, q if dht is None else dht, dh, q if dh0 is None else dh0, chunk_offsets, scale,
        T, NT, H, K, V, BT=chunk_size, BK=BK, BV=BV, USE_G=use_g, SCALAR_GATE=scalar_gate,
        Q_GATE_EXCLUSIVE=q_gate_exclusive, USE_DHT=dht is not None, STORE_DH0=need_dh0,
        VARLEN=chunk_offsets is not None, FP32_DOT=fp32_dot, OPERAND_DTYPE=operand_dtype,
        **options)
    return dh, dh0
