"""Chunked kernels of the delta rule (the WY form), without a gate (delta_rule), with one log
decay per head and step (gated_delta_rule) or one per key channel (kda, CHANNEL).

Per (batch, head), state S [K, V]: S_t = exp(g_t) (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t,
o_t = scale q_t S_t (g = 0 without a gate). Inside a chunk of BT = 64 rows with h the state
entering it, G the inclusive chunk-local cumulative log gate (float64, so differences keep float32
precision; a gate per channel's is float32 for 16-bit inputs, `chunk_cumgate_channels`),
Gamma_ts = exp(G_t - G_s) for s <= t (else 0) and L the chunk's last row:
    A  = strictly_lower(diag(beta) (Gamma * K K^T)),   Ti = (I + A)^{-1}
    w  = Ti diag(beta exp(G)) K,   u = Ti diag(beta) V,   U = u - w h   (the corrected values)
    o  = scale (diag(exp(G)) Q h + (Gamma * Q K^T) U)
    h' = exp(G_L) h + (diag(exp(G_L - G)) K)^T U
With a gate per key channel, exp(G) scales each column of K and Q, exp(G_L) each row of h, and the
pair products Gamma * K K^T and Gamma * Q K^T become sum_c k_tc k_sc exp(G_tc - G_sc) (and q's):
`chunk_pairs.py` forms them (Akk, Aqk) before the prepare kernel and takes their gradients after
the backward's per-chunk kernels; the kernels here read them instead of forming them.
Ti comes from `unit_lower_inverse`: 16-row diagonal blocks inverted by substitution (all four
at once, elementwise), the blocks below them by block substitution in 16 x 16 products. Only
the state walks cross chunks, and they carry the state alone (two products per chunk and
V-block); everything else is one program per chunk.

Forward:  `_prepare_kernel` (Ti, w, u per chunk; with a gate per channel also the gated q and
          k the walks read, so that they form no exponential of a tile) -> `_fwd_walk_kernel`
          (per V-block: U and the states entering each chunk for the backward, the final state)
          -> `_fwd_output_kernel` (o per chunk). With a gate per channel (kda) the walk writes o
          itself from the state in hand, no output kernel runs, and where no backward follows
          (no autograd) neither U nor the states are stored. w (and qg, kg) travel from the
          prepare kernel to both walks as their tf32 products read them, in half the bytes
          (fp16 with a power-of-two scale per chunk and key block, tf32_storage.py); so does U
          from the walk to the output kernel and the backward, and the states (per chunk and
          V-block) where no backward follows or, in delta_rule's training with bf16 inputs,
          where the backward too reads them through tf32 products alone: every result is the
          same bit for bit as from float32 operands, short of fp16's subnormals (`TF32_TILES`;
          at the bench shape on the H200, the forward of kda 2.22 ms against 2.35, of
          delta_rule 1.55 against 1.65). So does dU from the backward walk to the per-chunk
          kernels, for bf16 inputs.
Backward: `_bwd_local_kernel` (per chunk: dU's own part, scale (Gamma * Q K^T)^T do), then
          `_bwd_walk_kernel` walks back per V-block with dh the gradient of the state leaving a
          chunk: dU += diag(exp(G_L - G)) K dh, then
          dh <- exp(G_L) dh + scale (diag(exp(G)) Q)^T do - w^T dU (dh0 after the first chunk).
          Two per-chunk kernels then take every input gradient from dU and dh, in two so that
          neither holds more than two [BT, BK] accumulators (one kernel holding all spilled on
          Hopper): `_bwd_output_kernel` the products of q and k with the states, do and each
          other (dq, dk's first part), `_bwd_wy_kernel` the rest through
          dw = -dU h^T, w = Ti Y and u = Ti X (Y = diag(beta exp(G)) K, X = diag(beta) V):
          dY = Ti^T dw, dX = Ti^T dU, dTi = dw Y^T + dU X^T, dA = -Ti^T dTi Ti^T (strictly lower).
Two [BT, BT] products are needed transposed as well; each goes through per-chunk scratch and
is read back transposed (`_transposed`), not `tl.trans` of a dot's result (one such product was
miscompiled on Hopper, see DESIGN.md).

Triton 3.6 on the H100 (float64 checks of each kernel on its own inputs, run on the GPU):
- `acc += dot(a, b_t * vec[None, :])` over two or more V-blocks with 4 warps, b_t a transposed
  load, came out wrong (dk, dbeta off by 30-90 %); the V-loop's products take unscaled operands
  and beta scales the sum once after the loop.
- 16-wide V-blocks with 8 warps addressed shared memory out of range in the forward walk
  (compute-sanitizer) or gave wrong results; V-blocks are 32 wide (64 in the per-channel walks).
- The same on the H200 with 8 warps over 16-wide key tiles (K = 16) in the backward's chunk
  kernel (before it was split in two): a lost context or dq, dk, dbeta 30-80 x their bounds;
  the backward's per-chunk kernels take 4 warps.
- The output kernel's fp16 product of the pairs Gamma * Q K^T, a dot's result, with U over one
  32-wide V-block (V = 16 and 24, K = 64, gated_delta_rule; two V-blocks passed) gave o 100 x its
  bound on the H200, every gradient passing: the bf16 products of a dot's result that
  simple_gla's chunk kernel met over V-blocks <= 32 wide (ops/common/dot.py). It takes fp16
  products over 64-wide V-blocks only (K <= 128, where the walks' are as wide).

The gate gradient. dG_t, the gradient of the cumulative gate G_t, gathers every exp(G) factor:
exp(G_t) of the state read by q_t and of Y_t, the pair factors Gamma_ts of Q K^T and of A
(+ on row t, - on column s), exp(G_L) of the carried state and exp(G_L - G_s) of the write
k_s^T U_s; dg_t is the chunk-local reverse cumsum of dG. The diagonal pairs (Gamma_tt = 1) and
the last row's write (exp(G_L - G_L) = 1) carry no gate: they add and subtract the same term on
one row, so they are left out of both sides instead of cancelling to rounding.

Launch settings per kernel (V-block width, warps, pipelining) are `_settings`'.

Products: two loaded input tiles in the inputs' dtype (exact), anything computed as rounded tf32
(`mma` with float32 operands; with 16-bit inputs the walks, kda's where their V-blocks are 64
wide, and the scalar gates' output kernel take the same tf32 values as scaled fp16 tiles into
fp16 products, ops/common/tf32_storage.py), the triangular solve in IEEE fp32 and its gradient
in three tf32 products (`mma_tf32x3`, about 21 bits); fp32 inputs (and the interpreter) take
IEEE fp32 everywhere. A packed batch (cu_seqlens) runs on its chunk-aligned row
(ops/common/varlen.py): the walks take its sequences' chunk offsets.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.autograd import needed, save_context, upstream
from fla_kernels.ops.common.chunk_pairs import (pair_grads_kernel, pairs_kernel, cumgate_cols,
                                                cumgate_row, cumgate_rows, decay)
from fla_kernels.ops.common.chunk_state import chunk_cumgate
from fla_kernels.ops.common.dot import add_rounded, mma, mma_tf32_split_rhs, mma_tf32x3
from fla_kernels.ops.common.launch import compiles_ahead, flat_grid, launch
from fla_kernels.ops.common.tf32_storage import (column_scales, fp16_operand, mma_fp16, mma_fp16_split_rhs,
                                                  store_tf32_tile, tf32_scaled, tile_scale)
from fla_kernels.ops.common.tiles import (flat_program, head_program, initial_block, load_row,
                                          load_rows, load_rows_t, load_state, load_stored, store_row,
                                          store_rows, store_state)
from fla_kernels.ops.common.varlen import Packing, apply_packed, sequence_walk, state_count
from fla_kernels.precision import product_settings, store_dtype

CHUNK = 64   # tokens per chunk; `unit_lower_inverse` merges 16-row blocks up to it
CUMSUM_ROWS = tl.constexpr(16)   # rows `_chunk_cumsum_kernel` loads before it stores any of them
PAIR_BLOCK = 16   # rows per block of the per-channel pair matrices (chunk_pairs.py)
# the widest key head the chunk kernels take, as upstream's: at K = 256 a scalar gate's kernels fit
# the H100's shared memory (180 KB at most per kernel since the backward's chunk kernel was split
# and takes K 64 columns at a time) and kda's per-channel walks do; past it the per-channel
# backward walk needs 294,912 bytes (fp32, K = 264) of the H100's 232,448
WIDEST_KEY_HEAD = 256
# 16-bit inputs: the walks' computed operands, U (and without autograd the states) as fp16 tf32
# tiles; False keeps them float32, which every result equals bit for bit (the tests' check)
TF32_TILES = True


@triton.jit
def unit_lower_inverse(b_A, scratch, base, c0, T, H: tl.constexpr, BT: tl.constexpr):
    """(I + A)^{-1} [BT, BT] float32 for A strictly lower triangular (BT = 64), in IEEE fp32,
    through the program's rows of `scratch` [B, T, H, BT] (base = row * BT), which end holding it.

    A goes to the scratch and comes back as 16 x 16 blocks A_ij. The diagonal blocks D_i are
    inverted by substitution in the scratch, all four at once (`_diagonal_inverses`), and read
    back. The blocks below follow from Ti (I + A) = I, row by row from the diagonal leftwards:
    Ti_ij = -(sum_{j < s <= i} Ti_is A_sj) D_j, in 16 x 16 products (the association of
    pairwise merges of inverses; the other one, -D_i sum_s A_is Ti_sj, was 1.5 x less accurate in
    the last row's blocks; three tf32 products in place of these were 3 x less accurate and no
    faster). The blocks go back to the scratch and the whole inverse is read from it. Rows past
    T read as zero and are not stored; their A is zero, so the rows before them do not see them."""
    tl.static_assert(BT == 64)
    tl.debug_barrier()
    store_rows(scratch, b_A, base, c0, T, H, BT, BT, BT, 0)
    tl.debug_barrier()
    A10 = load_rows(scratch, base, c0 + 16, T, H, BT, 16, 16, 0)
    A20 = load_rows(scratch, base, c0 + 32, T, H, BT, 16, 16, 0)
    A21 = load_rows(scratch, base, c0 + 32, T, H, BT, 16, 16, 1)
    A30 = load_rows(scratch, base, c0 + 48, T, H, BT, 16, 16, 0)
    A31 = load_rows(scratch, base, c0 + 48, T, H, BT, 16, 16, 1)
    A32 = load_rows(scratch, base, c0 + 48, T, H, BT, 16, 16, 2)
    tl.debug_barrier()
    _diagonal_inverses(scratch, base, c0, T, H, BT)
    tl.debug_barrier()
    D0 = load_rows(scratch, base, c0, T, H, BT, 16, 16, 0)
    D1 = load_rows(scratch, base, c0 + 16, T, H, BT, 16, 16, 1)
    D2 = load_rows(scratch, base, c0 + 32, T, H, BT, 16, 16, 2)
    D3 = load_rows(scratch, base, c0 + 48, T, H, BT, 16, 16, 3)
    T10 = -_ieee(_ieee(D1, A10), D0)
    T21 = -_ieee(_ieee(D2, A21), D1)
    T32 = -_ieee(_ieee(D3, A32), D2)
    T20 = -_ieee(_ieee(T21, A10) + _ieee(D2, A20), D0)
    T31 = -_ieee(_ieee(T32, A21) + _ieee(D3, A31), D1)
    T30 = -_ieee(_ieee(T31, A10) + _ieee(T32, A20) + _ieee(D3, A30), D0)
    tl.debug_barrier()
    store_rows(scratch, T10, base, c0 + 16, T, H, BT, 16, 16, 0)
    store_rows(scratch, T20, base, c0 + 32, T, H, BT, 16, 16, 0)
    store_rows(scratch, T21, base, c0 + 32, T, H, BT, 16, 16, 1)
    store_rows(scratch, T30, base, c0 + 48, T, H, BT, 16, 16, 0)
    store_rows(scratch, T31, base, c0 + 48, T, H, BT, 16, 16, 1)
    store_rows(scratch, T32, base, c0 + 48, T, H, BT, 16, 16, 2)
    tl.debug_barrier()
    return load_rows(scratch, base, c0, T, H, BT, BT, BT, 0)


@triton.jit
def _diagonal_inverses(scratch, base, c0, T, H: tl.constexpr, BT: tl.constexpr):
    """Overwrite the four 16 x 16 diagonal blocks A_jj of the strictly lower A in `scratch` with
    (I + A_jj)^{-1}, all four at once as one [4, 16, 16] tile, by substitution: once row s of
    each block is final, step s subtracts A_is times it from every row i below (a column of a
    strictly lower A is zero down to its diagonal), one fma per term. Each entry is the same
    sequential float32 sum an IEEE product forms (the 15 products per block this replaced), in
    elementwise steps without a product's layout conversions: the prepare kernel 1.22 -> 1.01
    ms at the bench shape on an H200, the solve's largest error the same (benchmarks/tuning.md)."""
    blk = tl.arange(0, 4)[:, None, None]
    i = tl.arange(0, 16)[None, :, None]
    j = tl.arange(0, 16)[None, None, :]
    t = c0 + 16 * blk + i
    offs = base + t.to(tl.int64) * (H * BT) + 16 * blk + j
    m = (t < T) & (j < 16)
    b_A = tl.load(scratch + offs, mask=m, other=0)
    b_T = tl.where(i == j, 1.0, 0.0) + tl.zeros([4, 16, 16], dtype=tl.float32)
    for s in tl.static_range(15):
        a_s = tl.sum(tl.where(j == s, b_A, 0.0), axis=2)
        x_s = tl.sum(tl.where(i == s, b_T, 0.0), axis=1)
        b_T = tl.fma(-a_s[:, :, None], x_s[:, None, :], b_T)
    tl.store(scratch + offs, b_T, mask=m)


@triton.jit
def _state_product(a, b, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """a @ b for b computed and shared by every row of a (a state h or its gradient dh, dU, dw
    under Ti^T): with fp16 inputs b in two tf32 parts (`mma_tf32_split_rhs`), one tf32 product
    otherwise. One tf32 rounding of b is as coarse as fp16's own, and every row's sum repeats its
    error, so it adds up over a chunk instead of averaging out. On an H200 (emulated tensor cores
    give the same numbers): the sums over t of delta_rule's dbeta 1.07 x their bound (T = 65,
    K = V = 60) through dw = -dU h^T; kda's dbeta at one token 1.46 x, its sum 5.5, through
    dU += k dh, dX = Ti^T dU and dY = Ti^T dw; gated_delta_rule's dg summed over t 1.39 x
    (T = 2) through U dh^T. bf16's rounding is 8 x coarser than tf32's: one product."""
    if OPERAND_DTYPE == tl.float16:
        return mma_tf32_split_rhs(a, b, FP32_DOT)
    else:
        return mma(a, b, FP32_DOT, tl.float32)


@triton.jit
def _state_product_fp16(a16, b, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """`_state_product` of an fp16 tile a16 on fp16 tensor cores (`mma_fp16`), the same numbers."""
    if OPERAND_DTYPE == tl.float16:
        return mma_fp16_split_rhs(a16, b, FP32_DOT)
    else:
        return mma_fp16(a16, b, FP32_DOT)


@triton.jit
def _ieee(a, b):
    """a @ b in IEEE fp32 (the solve's products)."""
    return mma(a, b, True, tl.float32)


@triton.jit
def _vec(x, row, c0, T, H: tl.constexpr, BT: tl.constexpr):
    """[BT] float32 of x [B, T, H] at rows c0.. of the program's (batch, head) (zero past T)."""
    t = c0 + tl.arange(0, BT)
    return tl.load(x + row + t.to(tl.int64) * H, mask=t < T, other=0).to(tl.float32)


@triton.jit
def _store_vec(x, val, row, c0, T, H: tl.constexpr, BT: tl.constexpr):
    """Store [BT] into x [B, T, H] at rows c0.. of the program's (batch, head), in x's dtype."""
    t = c0 + tl.arange(0, BT)
    tl.store(x + row + t.to(tl.int64) * H, val.to(x.dtype.element_ty), mask=t < T)


@triton.jit
def _gates(g, gc, i_b, i_h, row, c0, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
           BK: tl.constexpr, GATED: tl.constexpr, CHANNEL: tl.constexpr, i_k=0):
    """The decays of the chunk at c0, shaped to scale row tiles [BT, BK] (key columns i_k*BK..
    with a gate per channel), their transposes [BK, BT] and states [BK, BV]: (eG, eLG, eG_t,
    eLG_t, eL, Gamma, Gamma^T) float32 for exp(G), exp(G_L - G), the same transposed, exp(G_L),
    and the pair decays exp(G_t - G_s) for s <= t (zero above the diagonal). A scalar gate
    (GATED) gives [BT, 1] and [1, BT] columns from its float64 chunk-local cumsum, a scalar eL
    and the pair decays; a gate per key channel (CHANNEL: gc [B, T, H, K] its float64 cumsum)
    gives full tiles and eL [BK, 1], its pairs being the pair matrices themselves
    (chunk_pairs.py), so Gamma is the mask alone; no gate gives ones."""
    o = tl.arange(0, BT)
    lower = o[:, None] >= o[None, :]
    if CHANNEL:
        t = c0 + o
        b_G = cumgate_rows(gc, row * K, t, t < T, H, K, BK, i_k)
        b_Gt = cumgate_cols(gc, row * K, t, t < T, H, K, BK, i_k)
        b_GL = _last_cumgate(gc, row, c0, T, H, K, BT, BK, i_k)
        eG = tl.exp(b_G.to(tl.float32))
        eLG = decay(b_GL[None, :] - b_G)
        eG_t = tl.exp(b_Gt.to(tl.float32))
        eLG_t = decay(b_GL[:, None] - b_Gt)
        eL = tl.exp(b_GL.to(tl.float32))[:, None]
        gam = tl.where(lower, 1.0, 0.0)
        gam_t = tl.where(o[:, None] <= o[None, :], 1.0, 0.0)
    elif GATED:
        b_G, b_GL = chunk_cumgate(g, i_b, i_h, c0, T, H, BT)
        eG = tl.exp(b_G.to(tl.float32))[:, None]
        eLG = tl.exp((b_GL - b_G).to(tl.float32))[:, None]
        eG_t = tl.exp(b_G.to(tl.float32))[None, :]
        eLG_t = tl.exp((b_GL - b_G).to(tl.float32))[None, :]
        eL = tl.exp(b_GL.to(tl.float32))
        diff = (b_G[:, None] - b_G[None, :]).to(tl.float32)
        gam = tl.where(lower, tl.exp(tl.minimum(diff, 0.0)), 0.0)
        gam_t = tl.where(o[:, None] <= o[None, :], tl.exp(tl.minimum(-diff, 0.0)), 0.0)
    else:
        eG = tl.full([BT, 1], 1.0, tl.float32)
        eLG = eG
        eG_t = tl.full([1, BT], 1.0, tl.float32)
        eLG_t = eG_t
        eL = 1.0
        gam = tl.where(lower, 1.0, 0.0)
        gam_t = tl.where(o[:, None] <= o[None, :], 1.0, 0.0)
    return eG, eLG, eG_t, eLG_t, eL, gam, gam_t


@triton.jit
def _last_cumgate(gc, row, c0, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                  BK: tl.constexpr, i_k=0):
    """[BK] G_L, the cumulative gate per key channel (columns i_k*BK..) at the last row of the
    chunk at c0, in gc's dtype."""
    return cumgate_row(gc, row * K, tl.minimum(c0 + BT, T) - 1, T, H, K, BK, i_k)


@triton.jit
def _walk_decays(g, gc, i_b, i_h, row, c0, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                 BK: tl.constexpr, GATED: tl.constexpr, CHANNEL: tl.constexpr):
    """(eL, eG_t) of the chunk at c0 for the walks: exp(G_L), the decay of the state leaving it
    ([BK, 1] per key channel, from G_L alone; a scalar for a scalar gate; 1 without), and a scalar
    gate's exp(G) [1, BT] (ones otherwise: the per-channel walks read qg, which holds it)."""
    eG_t = tl.full([1, BT], 1.0, tl.float32)
    if CHANNEL:
        eL = tl.exp(_last_cumgate(gc, row, c0, T, H, K, BT, BK).to(tl.float32))[:, None]
    elif GATED:
        b_G, b_GL = chunk_cumgate(g, i_b, i_h, c0, T, H, BT)
        eL = tl.exp(b_GL.to(tl.float32))
        eG_t = tl.exp(b_G.to(tl.float32))[None, :]
    else:
        eL = 1.0
    return eL, eG_t


@triton.jit
def _walk_keys(k, kg, g, gc, i_b, i_h, row, c0, T, H: tl.constexpr, K: tl.constexpr,
               BT: tl.constexpr, BK: tl.constexpr, GATED: tl.constexpr, CHANNEL: tl.constexpr,
               TRANSPOSED: tl.constexpr):
    """(the keys of the chunk at c0 as written into the state leaving it, diag(exp(G_L - G)) K
    [BT, BK] or with TRANSPOSED [BK, BT], and exp(G_L)) for the walks. With a gate per channel
    from kg, which `_prepare_kernel` stored, and eL [BK, 1] from G_L alone, so that a walk
    forms no exponential of a tile; else from k and `_gates`."""
    if CHANNEL:
        if TRANSPOSED:
            b_kg = load_rows_t(kg, row * K, c0, T, H, K, BT, BK, 0)
        else:
            b_kg = load_rows(kg, row * K, c0, T, H, K, BT, BK, 0)
        eL, eG_t = _walk_decays(g, gc, i_b, i_h, row, c0, T, H, K, BT, BK, GATED, CHANNEL)
    else:
        eG, eLG, eG_t, eLG_t, eL, gam, gam_t = _gates(g, gc, i_b, i_h, row, c0, T, H, K, BT, BK,
                                                      GATED, CHANNEL)
        if TRANSPOSED:
            b_kg = load_rows_t(k, row * K, c0, T, H, K, BT, BK, 0) * eLG_t
        else:
            b_kg = load_rows(k, row * K, c0, T, H, K, BT, BK, 0) * eLG
    return b_kg, eL


@triton.jit
def _walk_queries_t(q, qg, qs, s_idx, g, gc, scale, i_b, i_h, row, c0, T, H: tl.constexpr,
                    K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BKS: tl.constexpr,
                    GATED: tl.constexpr, CHANNEL: tl.constexpr, FP16_OPERANDS: tl.constexpr):
    """(Q^T [BK, BT], f): the queries of the chunk at c0 as they read the state entering it, for
    the backward walk, whose product with them times f is scale (diag(exp(G)) Q)^T do. With a gate
    per channel qg as `_prepare_kernel` stored it (`_scaled`: the operand the tile holds) and
    f = scale; else scale diag(exp(G)) Q formed from q and f = 1."""
    if CHANNEL:
        b_qgt = _scaled(load_rows_t(qg, row * K, c0, T, H, K, BT, BK, 0), qs, s_idx, K, BK, BKS, True,
                        FP16_OPERANDS)
        f = scale
    else:
        eG, eLG, eG_t, eLG_t, eL, gam, gam_t = _gates(g, gc, i_b, i_h, row, c0, T, H, K, BT, BK,
                                                      GATED, CHANNEL)
        b_qgt = load_rows_t(q, row * K, c0, T, H, K, BT, BK, 0) * (eG_t * scale)
        f = 1.0
    return b_qgt, f


@triton.jit
def _key_block_decay(eG, eG_t, eLG, g, gc, i_b, i_h, row, c0, T, H: tl.constexpr, K: tl.constexpr,
                     BT: tl.constexpr, BK: tl.constexpr, GATED: tl.constexpr, CHANNEL: tl.constexpr,
                     i_k):
    """(exp(G), its transpose, exp(G_L - G)) for key block i_k: `_gates`' eG, eG_t, eLG as
    given without a gate per channel (the same at every block, so formed once), else formed for
    the block's columns."""
    if CHANNEL:
        kG, kLG, kG_t, kLG_t, kL, kgam, kgam_t = _gates(g, gc, i_b, i_h, row, c0, T, H, K, BT, BK,
                                                        GATED, CHANNEL, i_k)
    else:
        kG, kG_t, kLG = eG, eG_t, eLG
    return kG, kG_t, kLG


@triton.jit
def _chunk_program(T, H: tl.constexpr, BT: tl.constexpr):
    """(i_c, i_b, i_h, row) of a per-chunk program on flat_grid(NT, B * H): its chunk, batch,
    head and first row (tiles.head_program)."""
    i_c, _, _, i_b, i_h, row = head_program(T, H, tl.cdiv(T, BT), 1)
    return i_c, i_b, i_h, row


@triton.jit
def _walk_program(chunk_offsets, T, NT, H: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                  VARLEN: tl.constexpr):
    """(i_v, i_bh, i_b, i_h, row, i_row, c_lo, c_hi) of a walk's program on flat_grid(V-blocks,
    B * H) or, with VARLEN, flat_grid(V-blocks, N * H) (`sequence_walk`)."""
    i_v, _, i_bh = flat_program(tl.cdiv(V, BV), 1)
    i_b, i_h, i_row, c_lo, c_hi = sequence_walk(chunk_offsets, i_bh, NT, H, VARLEN)
    return i_v, i_bh, i_b, i_h, i_b * T * H + i_h, i_row, c_lo, c_hi


@triton.jit
def _tile_index(i_row, i_c, NT, D: tl.constexpr, BS: tl.constexpr):
    """Where the scale of the first BS-column tile of chunk i_c of (batch, head) number i_row
    (b * H + h) is (`store_tf32_tile`); its other tiles' follow."""
    return (i_row.to(tl.int64) * NT + i_c) * ((D + BS - 1) // BS)


@triton.jit
def _walk_tile_scale(scales, i_row, i_c, NT, V: tl.constexpr, BV: tl.constexpr, BVS: tl.constexpr, i_v):
    """The scale of the forward walk's fp16 tile (a state or U, BVS columns wide) that holds
    V-block i_v, BV <= BVS wide, of chunk i_c of (batch, head) number i_row."""
    return tile_scale(scales, _tile_index(i_row, i_c, NT, V, BVS) + i_v * BV // BVS)


@triton.jit
def _scaled(x, scales, s_idx, D: tl.constexpr, BD: tl.constexpr, BS: tl.constexpr,
            TRANSPOSED: tl.constexpr, FP16_OPERANDS: tl.constexpr):
    """A walk's operand tile x [BT, BD] (or [BD, BT] with TRANSPOSED) as its tf32 product reads it:
    with FP16_OPERANDS its fp16 values times the scales of its tiles of BS columns
    (`column_scales`), else x itself."""
    if FP16_OPERANDS:
        s = column_scales(scales, s_idx, D, BD, BS)
        if TRANSPOSED:
            x = x * s[:, None]
        else:
            x = x * s[None, :]
    return x


@triton.jit
def _store_operand(x, xs, s_idx, val, base, c0, T, H: tl.constexpr, D: tl.constexpr,
                   BT: tl.constexpr, BD: tl.constexpr, i_d, FP16_OPERANDS: tl.constexpr):
    """Store a walk's operand tile: float32, or with FP16_OPERANDS as the tf32 value the walk's
    product reads, in fp16 with its scale at xs[s_idx] (`store_tf32_tile`)."""
    if FP16_OPERANDS:
        store_tf32_tile(x, xs, s_idx, val, base, c0, T, H, D, BT, BD, i_d)
    else:
        store_rows(x, val, base, c0, T, H, D, BT, BD, i_d)


@triton.jit
def _store_state_operand(states, hs, s_idx, val, index, K: tl.constexpr, V: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, i_v, FP16_STATES: tl.constexpr):
    """Store the state block entering a chunk: float32, or with FP16_STATES as the tf32 value the
    output's product reads, in fp16 with its scale at hs[s_idx] (`tf32_scaled`)."""
    if FP16_STATES:
        val, s = tf32_scaled(val)
        tl.store(hs + s_idx, s)
    store_state(states, index, val, K, V, BK, BV, 0, i_v, False)


@triton.jit(do_not_specialize=["T"])
def _prepare_kernel(q, k, v, beta, g, gc, Akk, Ai, w, u, qg, kg, ws, qs, ks, T, H: tl.constexpr,
                    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                    BV: tl.constexpr, GATED: tl.constexpr, CHANNEL: tl.constexpr,
                    FP16_OPERANDS: tl.constexpr, FP16_PRODUCTS: tl.constexpr, FP32_DOT: tl.constexpr,
                    OPERAND_DTYPE: tl.constexpr):
    """Per chunk: Ti [B, T, H, BT] (in Ai, the solve's scratch), w [B, T, H, K] and
    u [B, T, H, V], float32, and with CHANNEL the gated queries and keys the walks and the
    output read, qg = diag(exp(G)) Q and kg = diag(exp(G_L - G)) K [B, T, H, K] float32 (kg also
    for the walks' FP16_PRODUCTS); K is taken BK columns at a time. With FP16_OPERANDS w, qg and
    kg are stored as the walks' tf32 products read them, in fp16 with a scale per chunk and key
    block in ws, qs and ks (`store_tf32_tile`)."""
    NK: tl.constexpr = (K + BK - 1) // BK
    i_c, i_b, i_h, row = _chunk_program(T, H, BT)
    c0 = i_c * BT
    s_idx = _tile_index(i_b * H + i_h, i_c, tl.cdiv(T, BT), K, BK)
    b_beta = _vec(beta, row, c0, T, H, BT)
    o = tl.arange(0, BT)
    eG, eLG, eG_t, eLG_t, eL, gam, gam_t = _gates(g, gc, i_b, i_h, row, c0, T, H, K, BT, BK, GATED,
                                                  CHANNEL)
    if CHANNEL:
        b_kk = load_rows(Akk, row * BT, c0, T, H, BT, BT, BT, 0)
    else:
        b_kk = tl.zeros([BT, BT], dtype=tl.float32)
        for i_k in range(NK):
            b_kk += mma(load_rows(k, row * K, c0, T, H, K, BT, BK, i_k),
                        load_rows_t(k, row * K, c0, T, H, K, BT, BK, i_k), FP32_DOT, OPERAND_DTYPE)
        b_kk = b_kk * gam
    b_T = unit_lower_inverse(tl.where(o[:, None] > o[None, :], b_kk * b_beta[:, None], 0.0), Ai,
                             row * BT, c0, T, H, BT)
    for i_k in range(NK):
        kG, kG_t, kLG = _key_block_decay(eG, eG_t, eLG, g, gc, i_b, i_h, row, c0, T, H, K, BT, BK,
                                         GATED, CHANNEL, i_k)
        b_k = load_rows(k, row * K, c0, T, H, K, BT, BK, i_k)
        b_w = mma(b_T, b_k * (kG * b_beta[:, None]), FP32_DOT, tl.float32)
        _store_operand(w, ws, s_idx + i_k, b_w, row * K, c0, T, H, K, BT, BK, i_k, FP16_OPERANDS)
        if CHANNEL or FP16_PRODUCTS:
            _store_operand(kg, ks, s_idx + i_k, b_k * kLG, row * K, c0, T, H, K, BT, BK, i_k, FP16_OPERANDS)
        if CHANNEL:
            _store_operand(qg, qs, s_idx + i_k, load_rows(q, row * K, c0, T, H, K, BT, BK, i_k) * kG,
                           row * K, c0, T, H, K, BT, BK, i_k, FP16_OPERANDS)
    for i_v in range(tl.cdiv(V, BV)):
        b_v = load_rows(v, row * V, c0, T, H, V, BT, BV, i_v)
        store_rows(u, mma(b_T, b_v * b_beta[:, None], FP32_DOT, tl.float32), row * V, c0, T, H, V,
                   BT, BV, i_v)


@triton.jit(do_not_specialize=["T", "NT"])
def _fwd_walk_kernel(q, k, qg, kg, g, gc, Aqk, w, u, ws, qs, ks, hs, us, h0, ht, states, vnew, o,
                     chunk_offsets, scale, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATED: tl.constexpr,
                     CHANNEL: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
                     VARLEN: tl.constexpr, STORE: tl.constexpr, FP16_OPERANDS: tl.constexpr,
                     FP16_STATES: tl.constexpr, FP16_U: tl.constexpr, FP16_PRODUCTS: tl.constexpr,
                     BKS: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """Per V-block, chunk after chunk: with STORE the states entering each chunk
    [B, H, NT, K, V] and U [B, T, H, V], float32, for `_fwd_output_kernel` and the backward; with
    a gate per channel (CHANNEL) o [B, T, H, V] at once from the state in hand, from the output
    operands `_prepare_kernel` and the pair kernel stored; ht [N, H, K, V] float32 when STORE_HT.
    With FP16_OPERANDS w, qg and kg are fp16 with a scale per chunk and BKS columns in ws, qs and
    ks (`_scaled`); with FP16_STATES the states it stores, with FP16_U U, are fp16 tf32 tiles with
    a scale per chunk and V-block in hs and us (`tf32_scaled`). FP16_PRODUCTS (FP16_OPERANDS; with
    a scalar gate or none FP16_U, with one per channel 64-wide V-blocks): `_fwd_step_fp16`."""
    i_v, i_bh, i_b, i_h, row, i_row, c_lo, c_hi = _walk_program(chunk_offsets, T, NT, H, V, BV, VARLEN)
    b_h = initial_block(h0, i_bh, K, V, BK, BV, 0, i_v, USE_H0, False)
    for i_c in range(c_lo, c_hi):
        c0 = i_c * BT
        s_idx = _tile_index(i_row, i_c, NT, K, BKS)
        v_idx = _tile_index(i_row, i_c, NT, V, BV) + i_v
        if STORE:
            _store_state_operand(states, hs, v_idx, b_h, i_row * NT + i_c, K, V, BK, BV, i_v, FP16_STATES)
        if FP16_PRODUCTS:
            b_h = _fwd_step_fp16(w, ws, u, kg, ks, qg, qs, Aqk, g, gc, vnew, us, o, scale, v_idx, s_idx, b_h,
                                 i_b, i_h, row, c0, T, H, K, V, BT, BK, BV, BKS, i_v, GATED, CHANNEL, STORE,
                                 FP32_DOT)
        else:
            b_kgt, eL = _walk_keys(k, kg, g, gc, i_b, i_h, row, c0, T, H, K, BT, BK, GATED, CHANNEL, True)
            if CHANNEL:
                b_kgt = _scaled(b_kgt, ks, s_idx, K, BK, BKS, True, FP16_OPERANDS)
            b_w = _scaled(load_rows(w, row * K, c0, T, H, K, BT, BK, 0), ws, s_idx, K, BK, BKS, False,
                          FP16_OPERANDS)
            b_u = load_rows(u, row * V, c0, T, H, V, BT, BV, i_v)
            b_U = b_u - mma(b_w, b_h, FP32_DOT, tl.float32)
            if CHANNEL:
                b_qg, b_s = _output_operands(q, k, qg, g, gc, Aqk, i_b, i_h, row, c0, T, H, K, BT, BK, GATED,
                                             CHANNEL, FP32_DOT, OPERAND_DTYPE)
                b_qg = _scaled(b_qg, qs, s_idx, K, BK, BKS, False, FP16_OPERANDS)
                store_rows(o, _output_block(b_qg, b_s, b_h, b_U, scale, FP32_DOT), row * V, c0, T, H, V, BT,
                           BV, i_v)
            if STORE:
                _store_operand(vnew, us, v_idx, b_U, row * V, c0, T, H, V, BT, BV, i_v, FP16_U)
            b_h = add_rounded(b_h * eL, mma(b_kgt, b_U, FP32_DOT, tl.float32))
    if STORE_HT:
        store_state(ht, i_bh, b_h, K, V, BK, BV, 0, i_v, False)


@triton.jit
def _fwd_step_fp16(w, ws, u, kg, ks, qg, qs, Aqk, g, gc, vnew, us, o, scale, v_idx, s_idx, b_h, i_b, i_h, row,
                   c0, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, BKS: tl.constexpr, i_v, GATED: tl.constexpr,
                   CHANNEL: tl.constexpr, STORE: tl.constexpr, FP32_DOT: tl.constexpr):
    """The state leaving the chunk at c0 from b_h entering it, with STORE U stored as its fp16
    tile, and with a gate per channel o: the walk's products on fp16 tensor cores, the same numbers as its
    tf32 ones. w, kg and qg are read as `_prepare_kernel` stored them, their columns' scales
    folded into the rows of h and of the product k^T U; h, U and the pairs go in as
    `fp16_operand`s."""
    eL, eG_t = _walk_decays(g, gc, i_b, i_h, row, c0, T, H, K, BT, BK, GATED, CHANNEL)
    b_w = load_stored(w, row * K, c0, T, H, K, BT, BK, 0, False)
    b_U = load_rows(u, row * V, c0, T, H, V, BT, BV, i_v) - mma_fp16(
        b_w, b_h * column_scales(ws, s_idx, K, BK, BKS)[:, None], FP32_DOT)
    b_U, s_U = fp16_operand(b_U)
    if STORE:
        store_rows(vnew, b_U, row * V, c0, T, H, V, BT, BV, i_v)
        tl.store(us + v_idx, s_U)
    if CHANNEL:
        b_qh = mma_fp16(load_stored(qg, row * K, c0, T, H, K, BT, BK, 0, False),
                        b_h * column_scales(qs, s_idx, K, BK, BKS)[:, None], FP32_DOT)
        b_s, s_s = fp16_operand(load_rows(Aqk, row * BT, c0, T, H, BT, BT, BT, 0))
        store_rows(o, (b_qh + mma(b_s, b_U, FP32_DOT, tl.float16) * (s_s * s_U)) * scale, row * V, c0, T, H,
                   V, BT, BV, i_v)
    b_kgt = load_stored(kg, row * K, c0, T, H, K, BT, BK, 0, True)
    return add_rounded(b_h * eL, mma(b_kgt, b_U, FP32_DOT, tl.float16)
                       * (column_scales(ks, s_idx, K, BK, BKS)[:, None] * s_U))


@triton.jit
def _output_operands(q, k, qg, g, gc, Aqk, i_b, i_h, row, c0, T, H: tl.constexpr, K: tl.constexpr,
                     BT: tl.constexpr, BK: tl.constexpr, GATED: tl.constexpr, CHANNEL: tl.constexpr,
                     FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """(diag(exp(G)) Q [BT, BK], the pairs Gamma * Q K^T [BT, BT]) of the chunk at c0, what its
    outputs take besides the state entering it and U: read from qg and Aqk with a gate per
    channel, else formed from q and k."""
    if CHANNEL:
        b_qg = load_rows(qg, row * K, c0, T, H, K, BT, BK, 0)
        b_s = load_rows(Aqk, row * BT, c0, T, H, BT, BT, BT, 0)
    else:
        eG, eLG, eG_t, eLG_t, eL, gam, gam_t = _gates(g, gc, i_b, i_h, row, c0, T, H, K, BT, BK,
                                                      GATED, CHANNEL)
        b_q = load_rows(q, row * K, c0, T, H, K, BT, BK, 0)
        b_s = mma(b_q, load_rows_t(k, row * K, c0, T, H, K, BT, BK, 0), FP32_DOT, OPERAND_DTYPE) * gam
        b_qg = b_q * eG
    return b_qg, b_s


@triton.jit
def _output_block(b_qg, b_s, b_h, b_U, scale, FP32_DOT: tl.constexpr):
    """o = scale (diag(exp(G)) Q h + (Gamma * Q K^T) U) of one V-block of a chunk."""
    return (mma(b_qg, b_h, FP32_DOT, tl.float32) + mma(b_s, b_U, FP32_DOT, tl.float32)) * scale


@triton.jit(do_not_specialize=["T", "NT"])
def _fwd_output_kernel(q, k, qg, g, gc, Aqk, hs, us, states, vnew, o, scale, T, NT, H: tl.constexpr,
                       K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                       BV: tl.constexpr, GATED: tl.constexpr, CHANNEL: tl.constexpr,
                       FP16_STATES: tl.constexpr, FP16_U: tl.constexpr, FP16_PRODUCTS: tl.constexpr,
                       BVS: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """Per chunk, from the state entering it and its U: o [B, T, H, V], every V-block. With
    FP16_STATES the states, with FP16_U U, are the walk's fp16 tf32 tiles, a scale per chunk and
    BVS columns in hs and us (`_walk_tile_scale`). FP16_PRODUCTS (FP16_U): `_output_block_fp16`."""
    i_c, i_b, i_h, row = _chunk_program(T, H, BT)
    c0 = i_c * BT
    index = (i_b * H + i_h) * NT + i_c
    b_qg, b_s = _output_operands(q, k, qg, g, gc, Aqk, i_b, i_h, row, c0, T, H, K, BT, BK, GATED, CHANNEL,
                                 FP32_DOT, OPERAND_DTYPE)
    if FP16_PRODUCTS:
        _output_block_fp16(hs, us, states, vnew, o, b_qg, b_s, index, scale, i_b, i_h, row, i_c, c0, T, NT, H,
                           K, V, BT, BK, BV, BVS, FP16_STATES, FP32_DOT)
    else:
        for i_v in range(tl.cdiv(V, BV)):
            b_h = load_state(states, index, K, V, BK, BV, 0, i_v, False)
            b_U = load_rows(vnew, row * V, c0, T, H, V, BT, BV, i_v)
            if FP16_STATES:
                b_h = b_h * _walk_tile_scale(hs, i_b * H + i_h, i_c, NT, V, BV, BVS, i_v)
            if FP16_U:
                b_U = b_U * _walk_tile_scale(us, i_b * H + i_h, i_c, NT, V, BV, BVS, i_v)
            store_rows(o, _output_block(b_qg, b_s, b_h, b_U, scale, FP32_DOT), row * V, c0, T, H, V, BT, BV,
                       i_v)


@triton.jit
def _output_block_fp16(hs, us, states, vnew, o, b_qg, b_s, index, scale, i_b, i_h, row, i_c, c0, T, NT,
                       H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                       BV: tl.constexpr, BVS: tl.constexpr, FP16_STATES: tl.constexpr,
                       FP32_DOT: tl.constexpr):
    """`_fwd_output_kernel`'s o from its operands b_qg and b_s, every V-block, in products on fp16
    tensor cores, the same numbers as its tf32 ones (`_output_block`): b_qg, b_s and float32
    states go in as `fp16_operand`s, the walk's fp16 tiles as stored, each product times its
    operands' scales."""
    b_qg, s_q = fp16_operand(b_qg)
    b_s, s_s = fp16_operand(b_s)
    for i_v in range(tl.cdiv(V, BV)):
        b_h = load_state(states, index, K, V, BK, BV, 0, i_v, False)
        if FP16_STATES:
            b_qh = mma(b_qg, b_h.to(tl.float16), FP32_DOT, tl.float16) * _walk_tile_scale(
                hs, i_b * H + i_h, i_c, NT, V, BV, BVS, i_v)
        else:
            b_qh = mma_fp16(b_qg, b_h, FP32_DOT)
        b_U = load_stored(vnew, row * V, c0, T, H, V, BT, BV, i_v, False)
        b_sU = mma(b_s, b_U, FP32_DOT, tl.float16) * _walk_tile_scale(us, i_b * H + i_h, i_c, NT, V, BV, BVS, i_v)
        store_rows(o, (b_qh * s_q + b_sU * s_s) * scale, row * V, c0, T, H, V, BT, BV, i_v)


@triton.jit(do_not_specialize=["T"])
def _bwd_local_kernel(q, k, g, gc, Aqk, do, dvnew, scale, T, H: tl.constexpr, K: tl.constexpr,
                      V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      GATED: tl.constexpr, CHANNEL: tl.constexpr, FP32_DOT: tl.constexpr,
                      OPERAND_DTYPE: tl.constexpr):
    """Per chunk, the part of dU [B, T, H, V] from the chunk's own outputs:
    scale (Gamma * Q K^T)^T do, every V-block (the backward walk adds the state's part)."""
    i_c, i_b, i_h, row = _chunk_program(T, H, BT)
    c0 = i_c * BT
    eG, eLG, eG_t, eLG_t, eL, gam, gam_t = _gates(g, gc, i_b, i_h, row, c0, T, H, K, BT, BK, GATED,
                                                  CHANNEL)
    if CHANNEL:
        b_st = load_rows_t(Aqk, row * BT, c0, T, H, BT, BT, BT, 0) * scale
    else:
        b_k = load_rows(k, row * K, c0, T, H, K, BT, BK, 0)
        b_qt = load_rows_t(q, row * K, c0, T, H, K, BT, BK, 0)
        b_st = mma(b_k, b_qt, FP32_DOT, OPERAND_DTYPE) * gam_t * scale
    for i_v in range(tl.cdiv(V, BV)):
        b_do = load_rows(do, row * V, c0, T, H, V, BT, BV, i_v)
        store_rows(dvnew, mma(b_st, b_do, FP32_DOT, tl.float32), row * V, c0, T, H, V, BT, BV, i_v)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_walk_kernel(q, k, qg, kg, g, gc, w, ws, qs, ks, do, dht, dhs, dvnew, du, dus, dh0, chunk_offsets,
                     scale, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                     BK: tl.constexpr, BV: tl.constexpr, GATED: tl.constexpr, CHANNEL: tl.constexpr,
                     USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, VARLEN: tl.constexpr,
                     FP16_OPERANDS: tl.constexpr, FP16_DU: tl.constexpr, FP16_PRODUCTS: tl.constexpr,
                     BKS: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr):
    """Per V-block, chunk after chunk backwards: dhs [B, H, NT, K, V], the gradient of the state
    leaving each chunk; dU [B, T, H, V] into du (dvnew holds the chunk's own part from
    `_bwd_local_kernel`, to which the state's part is added; du may be dvnew itself); dh0
    [N, H, K, V] when STORE_DH0; float32. With FP16_OPERANDS w, qg and kg are the forward's fp16
    tiles (`_scaled`); with FP16_DU dU is stored as such a tile, a scale per chunk and V-block in
    dus, as every later product reads it (`_store_operand`). FP16_PRODUCTS (FP16_OPERANDS, kg stored;
    with a gate per channel 64-wide V-blocks): `_bwd_step_fp16`."""
    i_v, i_bh, i_b, i_h, row, i_row, c_lo, c_hi = _walk_program(chunk_offsets, T, NT, H, V, BV, VARLEN)
    b_dh = initial_block(dht, i_bh, K, V, BK, BV, 0, i_v, USE_DHT, False)
    for i_r in range(c_hi - c_lo):
        i_c = c_hi - 1 - i_r
        c0 = i_c * BT
        s_idx = _tile_index(i_row, i_c, NT, K, BKS)
        store_state(dhs, i_row * NT + i_c, b_dh, K, V, BK, BV, 0, i_v, False)
        u_idx = _tile_index(i_row, i_c, NT, V, BV) + i_v
        if FP16_PRODUCTS:
            b_dh = _bwd_step_fp16(q, qg, qs, kg, ks, g, gc, w, ws, do, dvnew, du, dus, u_idx, s_idx, b_dh, scale,
                                  i_b, i_h, row, c0, T, H, K, V, BT, BK, BV, BKS, i_v, GATED, CHANNEL, FP16_DU,
                                  FP32_DOT, OPERAND_DTYPE)
        else:
            b_kg, eL = _walk_keys(k, kg, g, gc, i_b, i_h, row, c0, T, H, K, BT, BK, GATED, CHANNEL, False)
            if CHANNEL:
                b_kg = _scaled(b_kg, ks, s_idx, K, BK, BKS, False, FP16_OPERANDS)
            b_qgt, f = _walk_queries_t(q, qg, qs, s_idx, g, gc, scale, i_b, i_h, row, c0, T, H, K, BT, BK,
                                       BKS, GATED, CHANNEL, FP16_OPERANDS)
            b_wt = _scaled(load_rows_t(w, row * K, c0, T, H, K, BT, BK, 0), ws, s_idx, K, BK, BKS, True,
                           FP16_OPERANDS)
            b_do = load_rows(do, row * V, c0, T, H, V, BT, BV, i_v)
            b_dU = load_rows(dvnew, row * V, c0, T, H, V, BT, BV, i_v)
            b_dU += _state_product(b_kg, b_dh, FP32_DOT, OPERAND_DTYPE)
            _store_operand(du, dus, u_idx, b_dU, row * V, c0, T, H, V, BT, BV, i_v, FP16_DU)
            b_dh = b_dh * eL + mma(b_qgt, b_do, FP32_DOT, tl.float32) * f
            b_dh -= mma(b_wt, b_dU, FP32_DOT, tl.float32)
    if STORE_DH0:
        store_state(dh0, i_bh, b_dh, K, V, BK, BV, 0, i_v, False)


@triton.jit
def _bwd_step_fp16(q, qg, qs, kg, ks, g, gc, w, ws, do, dvnew, du, dus, u_idx, s_idx, b_dh, scale, i_b, i_h,
                   row, c0, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, BKS: tl.constexpr, i_v, GATED: tl.constexpr,
                   CHANNEL: tl.constexpr, FP16_DU: tl.constexpr, FP32_DOT: tl.constexpr,
                   OPERAND_DTYPE: tl.constexpr):
    """The gradient of the state entering the chunk at c0 from b_dh of the one leaving it, dU
    stored: the backward walk's products on fp16 tensor cores, the same numbers as its tf32 ones.
    kg, w and with a gate per channel qg are read as `_prepare_kernel` stored them, their
    columns' scales folded into the rows of dh and of the products w^T dU and qg^T do; the other
    operands go in as `fp16_operand`s."""
    eL, eG_t = _walk_decays(g, gc, i_b, i_h, row, c0, T, H, K, BT, BK, GATED, CHANNEL)
    b_kg = load_stored(kg, row * K, c0, T, H, K, BT, BK, 0, False)
    b_dU = load_rows(dvnew, row * V, c0, T, H, V, BT, BV, i_v) + _state_product_fp16(
        b_kg, b_dh * column_scales(ks, s_idx, K, BK, BKS)[:, None], FP32_DOT, OPERAND_DTYPE)
    _store_operand(du, dus, u_idx, b_dU, row * V, c0, T, H, V, BT, BV, i_v, FP16_DU)
    b_do = load_rows(do, row * V, c0, T, H, V, BT, BV, i_v)
    if CHANNEL:
        b_dh = b_dh * eL + mma_fp16(load_stored(qg, row * K, c0, T, H, K, BT, BK, 0, True), b_do, FP32_DOT) * (
            column_scales(qs, s_idx, K, BK, BKS)[:, None] * scale)
    else:
        b_qgt, s_q = fp16_operand(load_rows_t(q, row * K, c0, T, H, K, BT, BK, 0) * (eG_t * scale))
        b_dh = b_dh * eL + mma_fp16(b_qgt, b_do, FP32_DOT) * s_q
    b_wt = load_stored(w, row * K, c0, T, H, K, BT, BK, 0, True)
    return b_dh - mma_fp16(b_wt, b_dU, FP32_DOT) * column_scales(ws, s_idx, K, BK, BKS)[:, None]


@triton.jit
def _transposed(pairs, b_x, row, c0, T, H: tl.constexpr, BT: tl.constexpr, NB: tl.constexpr = 1,
                block=0):
    """b_x^T of a [BT, BT] tile, through the program's own rows of the scratch `pairs`
    [B, T, H, NB * BT] (its `block` of them: programs of one chunk each take their own): stored,
    then read back transposed (rows past T read as zero), with a barrier on each side (the
    previous read-back must be done before the store overwrites it)."""
    tl.debug_barrier()
    store_rows(pairs, b_x, row * (NB * BT), c0, T, H, NB * BT, BT, BT, block)
    tl.debug_barrier()
    return load_rows_t(pairs, row * (NB * BT), c0, T, H, NB * BT, BT, BT, block)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_output_kernel(q, k, g, gc, states, hs, vnew, us, do, dhs, du, dus, pairs, dAqk, dq, dk, dw, dg,
                       dgk, scale, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATED: tl.constexpr,
                       CHANNEL: tl.constexpr, FP16_STATES: tl.constexpr, FP16_U: tl.constexpr,
                       FP16_DU: tl.constexpr, BVS: tl.constexpr, FP32_DOT: tl.constexpr,
                       OPERAND_DTYPE: tl.constexpr):
    """Per chunk and block of BK key columns, the products of q and k with the states, do and
    each other: dq [B, T, H, K] whole (with CHANNEL less the pairs' part, left to
    `pair_grads_kernel` through dAqk), dw = -dU h^T and the first parts of dk [B, T, H, K] and of
    the gate's gradient, float32, which `_bwd_wy_kernel` completes: per channel in dg
    [B, T, H, K], or per row and key block in dgk [B, T, H, key blocks] for a scalar gate.
    `pairs` [B, T, H, key blocks * BT] is the transposes' scratch. With FP16_STATES the states,
    with FP16_U U, are the forward walk's fp16 tiles, with FP16_DU dU the backward walk's
    (`_walk_tile_scale`, `_du_block`)."""
    NK: tl.constexpr = (K + BK - 1) // BK
    i_k, i_c, _, i_b, i_h, row = head_program(T, H, tl.cdiv(K, BK), tl.cdiv(T, BT))
    c0 = i_c * BT
    index = (i_b * H + i_h) * NT + i_c
    o = tl.arange(0, BT)
    strict = o[:, None] > o[None, :]
    last = tl.minimum(T - c0, BT) - 1
    b_dqh = tl.zeros([BT, BK], dtype=tl.float32)    # do h^T
    b_dkh = tl.zeros([BT, BK], dtype=tl.float32)    # U dh^T
    b_dw = tl.zeros([BT, BK], dtype=tl.float32)     # -dU h^T
    b_ds = tl.zeros([BT, BT], dtype=tl.float32)     # do U^T
    b_bound = tl.zeros([BK], dtype=tl.float32)      # sum over V of h * dh
    for i_v in range(tl.cdiv(V, BV)):
        b_ht = load_state(states, index, K, V, BK, BV, i_k, i_v, True)
        b_dht = load_state(dhs, index, K, V, BK, BV, i_k, i_v, True)
        if FP16_STATES:
            b_ht = b_ht * _walk_tile_scale(hs, i_b * H + i_h, i_c, NT, V, BV, BVS, i_v)
        b_do = load_rows(do, row * V, c0, T, H, V, BT, BV, i_v)
        b_U = load_rows(vnew, row * V, c0, T, H, V, BT, BV, i_v)
        b_Ut = load_rows_t(vnew, row * V, c0, T, H, V, BT, BV, i_v)
        if FP16_U:
            u_s = _walk_tile_scale(us, i_b * H + i_h, i_c, NT, V, BV, BVS, i_v)
            b_U = b_U * u_s
            b_Ut = b_Ut * u_s
        b_dqh += mma(b_do, b_ht, FP32_DOT, tl.float32)
        b_dkh += _state_product(b_U, b_dht, FP32_DOT, OPERAND_DTYPE)
        b_dU = _du_block(du, dus, i_b, i_h, row, i_c, c0, T, NT, H, V, BT, BV, BVS, i_v, FP16_DU)
        b_dw -= _state_product(b_dU, b_ht, FP32_DOT, OPERAND_DTYPE)
        b_ds += mma(b_do, b_Ut, FP32_DOT, tl.float32)
        b_bound += tl.sum(b_ht * b_dht, axis=0)
    store_rows(dw, b_dw, row * K, c0, T, H, K, BT, BK, i_k)

    # the decays after the V-loop, which reads none of them (shorter live ranges: fewer spills)
    eG, eLG, eG_t, eLG_t, eL, gam, gam_t = _gates(g, gc, i_b, i_h, row, c0, T, H, K, BT, BK, GATED,
                                                  CHANNEL, i_k)
    b_q = load_rows(q, row * K, c0, T, H, K, BT, BK, i_k)
    b_k = load_rows(k, row * K, c0, T, H, K, BT, BK, i_k)
    # the state read by q: o += scale exp(G) q h
    b_dq = b_dqh * (eG * scale)
    # the write into the leaving state: exp(G_L - G_s) k_s^T U_s, and exp(G_L) h
    b_dGt = _own_gate_terms(b_dq, b_q, b_dkh, b_k, eLG, eL, b_bound, o, last, CHANNEL)
    b_dkw = b_dkh * eLG
    if CHANNEL:
        store_rows(dg, b_dGt, row * K, c0, T, H, K, BT, BK, i_k)
    b_own = tl.sum(b_dGt, axis=1)                    # the scalar gate's own terms
    # the pairs of o: scale Gamma * (Q K^T), read by U
    b_dqk = b_ds * gam * scale
    if CHANNEL:
        if i_k == 0:
            store_rows(dAqk, b_dqk, row * BT, c0, T, H, BT, BT, BT, 0)
        b_dk = b_dkw
    else:
        b_qk = mma(b_q, load_rows_t(k, row * K, c0, T, H, K, BT, BK, i_k), FP32_DOT, OPERAND_DTYPE)
        b_dq += mma(b_dqk, b_k, FP32_DOT, tl.float32)
        b_dk = mma(_transposed(pairs, b_dqk, row, c0, T, H, BT, NK, i_k), b_q, FP32_DOT, tl.float32)
        b_dk += b_dkw
        b_z = tl.where(strict, b_dqk * b_qk, 0.0)    # this key block's part
        if GATED:
            b_dG = tl.sum(b_z, axis=1) - tl.sum(b_z, axis=0)
            store_rows(dgk, (b_dG + b_own)[:, None], row * NK, c0, T, H, NK, BT, 1, i_k)
    store_rows(dq, b_dq, row * K, c0, T, H, K, BT, BK, i_k)
    store_rows(dk, b_dk, row * K, c0, T, H, K, BT, BK, i_k)


@triton.jit
def _own_gate_terms(b_dq, b_q, b_dkh, b_k, eLG, eL, b_bound, o, last, CHANNEL: tl.constexpr):
    """[BT, BK] the gate gradient's terms of the chunk's own state reads and writes, per key
    channel (a scalar gate sums them over the row): exp(G) of the state read by q (dq * q), and
    the write exp(G_L - G_s) k_s^T U_s (+ on the last row, - on row s; the last row's own write
    carries no gate) with exp(G_L) h (the last row; b_bound the sum over V of h * dh). Summed
    before the pairs' products so that the tiles they read are not held through them."""
    b_y = tl.where((o < last)[:, None], b_dkh * b_k * eLG, 0.0)
    b_bound = tl.sum(eL * b_bound[:, None], axis=1) if CHANNEL else eL * b_bound
    b_last = tl.where((o == last)[:, None], (tl.sum(b_y, axis=0) + b_bound)[None, :], 0.0)
    return b_dq * b_q + (b_last - b_y)


@triton.jit
def _du_block(du, dus, i_b, i_h, row, i_c, c0, T, NT, H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
              BV: tl.constexpr, BVS: tl.constexpr, i_v, FP16_DU: tl.constexpr):
    """[BT, BV] float32: V-block i_v of dU of the chunk at c0 as the backward walk stored it, with
    FP16_DU an fp16 tile times its scale (`_walk_tile_scale`: the tf32 operand itself)."""
    b_dU = load_rows(du, row * V, c0, T, H, V, BT, BV, i_v)
    if FP16_DU:
        b_dU = b_dU * _walk_tile_scale(dus, i_b * H + i_h, i_c, NT, V, BV, BVS, i_v)
    return b_dU


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_wy_kernel(k, v, beta, g, gc, Akk, Ai, du, dus, dw, pairs, dAkk, dk, dk_out, dv, dbeta, dg, dgk, T, NT,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, GATED: tl.constexpr, CHANNEL: tl.constexpr,
                   FP16_DU: tl.constexpr, BVS: tl.constexpr, FP32_DOT: tl.constexpr,
                   OPERAND_DTYPE: tl.constexpr):
    """Per chunk, the gradients through U = u - w h, u = Ti X and w = Ti Y: dv [B, T, H, V] and
    dbeta [B, T, H] whole, the rest of dk (added to `_bwd_output_kernel`'s part in dk, a block of
    BK key columns at a time, into dk_out: for a scalar gate or none the whole of dk, stored in
    the dtype torch returns it in) and of the gate's gradient, dg then the chunk-local reverse
    cumsum of dG for a scalar gate (with CHANNEL, dk_out is dk, dG so far, and the pairs' parts
    are left to `pair_grads_kernel` through dAkk). With FP16_DU dU is the backward walk's fp16
    tiles."""
    NK: tl.constexpr = (K + BK - 1) // BK
    i_c, i_b, i_h, row = _chunk_program(T, H, BT)
    c0 = i_c * BT
    o = tl.arange(0, BT)
    strict = o[:, None] > o[None, :]
    b_Tt = load_rows_t(Ai, row * BT, c0, T, H, BT, BT, BT, 0)
    b_beta = _vec(beta, row, c0, T, H, BT)
    eG, eLG, eG_t, eLG_t, eL, gam, gam_t = _gates(g, gc, i_b, i_h, row, c0, T, H, K, BT, BK, GATED,
                                                  CHANNEL)
    b_dT = tl.zeros([BT, BT], dtype=tl.float32)     # dU V^T, then dU X^T
    b_dbeta = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_dU = _du_block(du, dus, i_b, i_h, row, i_c, c0, T, NT, H, V, BT, BV, BVS, i_v, FP16_DU)
        b_v = load_rows(v, row * V, c0, T, H, V, BT, BV, i_v)
        b_dT += mma(b_dU, load_rows_t(v, row * V, c0, T, H, V, BT, BV, i_v), FP32_DOT, tl.float32)
        b_dX = _state_product(b_Tt, b_dU, FP32_DOT, OPERAND_DTYPE)
        store_rows(dv, b_dX * b_beta[:, None], row * V, c0, T, H, V, BT, BV, i_v)
        b_dbeta += tl.sum(b_dX * b_v, axis=1)
    b_dT = b_dT * b_beta[None, :]

    # w = Ti Y with Y = diag(beta) exp(G) K, a key block at a time: Y^T's part of dTi first (so
    # that k^T and its decays are not held through the rest); dY's parts with it where the pairs'
    # gradient is left to `pair_grads_kernel` (CHANNEL), else once dA is known, so that dk is
    # read and written once
    b_dG = tl.zeros([BT], dtype=tl.float32)         # the scalar gate's
    if GATED and not CHANNEL:
        b_dG += tl.sum(load_rows(dgk, row * NK, c0, T, H, NK, BT, NK, 0), axis=1)
    for i_k in range(NK):
        kG, kG_t, kLG = _key_block_decay(eG, eG_t, eLG, g, gc, i_b, i_h, row, c0, T, H, K, BT, BK,
                                         GATED, CHANNEL, i_k)
        b_dw = load_rows(dw, row * K, c0, T, H, K, BT, BK, i_k)
        b_kt = load_rows_t(k, row * K, c0, T, H, K, BT, BK, i_k)
        b_dT += mma(b_dw, b_kt * (kG_t * b_beta[None, :]), FP32_DOT, tl.float32)
        if CHANNEL:
            b_dk, b_kdY = _key_block_grads(b_Tt, b_dw, load_rows(k, row * K, c0, T, H, K, BT, BK, i_k), dk,
                                           row, c0, T, H, K, BT, BK, i_k, kG, b_beta, FP32_DOT,
                                           OPERAND_DTYPE)
            store_rows(dk, b_dk, row * K, c0, T, H, K, BT, BK, i_k)
            b_dbeta += tl.sum(b_kdY, axis=1)
            b_dGt = load_rows(dg, row * K, c0, T, H, K, BT, BK, i_k) + b_kdY * b_beta[:, None]
            store_rows(dg, b_dGt, row * K, c0, T, H, K, BT, BK, i_k)

    # Ti = (I + A)^{-1}, A = strictly_lower(diag(beta) (Gamma * K K^T)); Akk with CHANNEL. The
    # solve's gradient near fp32 (three tf32 products; IEEE with FP32_DOT): with beta near 1,
    # Ti's entries grow along the chunk, and one tf32 product here doubled kda's dbeta error
    # (fp16, K = 100, strong decay). IEEE products on the CUDA cores took 0.9 of the 2.9 ms of
    # this kernel at the bench shape on an H200; the three tf32 ones come within 2^-22 of them
    b_dA = -mma_tf32x3(mma_tf32x3(b_Tt, b_dT, FP32_DOT), b_Tt, FP32_DOT)
    b_dA = tl.where(strict, b_dA, 0.0)
    # K K^T and the pair decays formed after the solve's gradient, not held through it
    if CHANNEL:
        b_kk = load_rows(Akk, row * BT, c0, T, H, BT, BT, BT, 0)
    else:
        b_kk = tl.zeros([BT, BT], dtype=tl.float32)
        for i_k in range(NK):
            b_kk += mma(load_rows(k, row * K, c0, T, H, K, BT, BK, i_k),
                        load_rows_t(k, row * K, c0, T, H, K, BT, BK, i_k), FP32_DOT, OPERAND_DTYPE)
        gam = _gates(g, gc, i_b, i_h, row, c0, T, H, K, BT, BK, GATED, CHANNEL)[5]
        b_kk = b_kk * gam
    b_r = b_dA * b_kk
    b_dbeta_r = tl.sum(b_r, axis=1)                  # added last, as the sums before it were
    b_dAk = b_dA * b_beta[:, None]
    if CHANNEL:
        store_rows(dAkk, b_dAk, row * BT, c0, T, H, BT, BT, BT, 0)
    else:
        b_rG = b_r * b_beta[:, None]
        b_rG = tl.sum(b_rG, axis=1) - tl.sum(b_rG, axis=0)
        b_dAk = b_dAk * gam
        b_dAs = b_dAk + _transposed(pairs, b_dAk, row, c0, T, H, BT, NK, 0)
        for i_k in range(NK):
            kG, kG_t, kLG = _key_block_decay(eG, eG_t, eLG, g, gc, i_b, i_h, row, c0, T, H, K, BT, BK,
                                             GATED, CHANNEL, i_k)
            b_k = load_rows(k, row * K, c0, T, H, K, BT, BK, i_k)
            b_dk, b_kdY = _key_block_grads(b_Tt, load_rows(dw, row * K, c0, T, H, K, BT, BK, i_k), b_k, dk,
                                           row, c0, T, H, K, BT, BK, i_k, kG, b_beta, FP32_DOT,
                                           OPERAND_DTYPE)
            b_dk += mma(b_dAs, b_k, FP32_DOT, tl.float32)
            store_rows(dk_out, b_dk, row * K, c0, T, H, K, BT, BK, i_k)
            b_dbeta += tl.sum(b_kdY, axis=1)
            b_dG += tl.sum(b_kdY * b_beta[:, None], axis=1)
        if GATED:
            b_dG += b_rG
            _store_vec(dg, tl.cumsum(b_dG, axis=0, reverse=True), row, c0, T, H, BT)
    b_dbeta += b_dbeta_r
    _store_vec(dbeta, b_dbeta, row, c0, T, H, BT)


@triton.jit
def _key_block_grads(b_Tt, b_dw, b_k, dk, row, c0, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                     BK: tl.constexpr, i_k, kG, b_beta, FP32_DOT: tl.constexpr,
                     OPERAND_DTYPE: tl.constexpr):
    """(key block i_k of dk as `_bwd_output_kernel` left it plus w = Ti Y's part, and
    dY * k * exp(G): the block's terms of dbeta and of the gate's gradient) through dY = Ti^T dw,
    Y = diag(beta exp(G)) K; b_k is the block of k."""
    b_dY = _state_product(b_Tt, b_dw, FP32_DOT, OPERAND_DTYPE)
    b_dk = load_rows(dk, row * K, c0, T, H, K, BT, BK, i_k) + b_dY * (kG * b_beta[:, None])
    return b_dk, b_dY * b_k * kG


def _settings(K, dtype, gated: bool, channel: bool) -> tuple:
    """(BK, {kernel: launch settings}): all of K in one block (at least 16, a dot's smallest); per
    kernel its V-block width BV and num_warps (and num_stages of the walks), and a key block BK
    for those that take K a block at a time: 32 columns for the pair kernels and the prepare
    kernel (64 with a gate per channel: 0.97 against 1.02 ms at the bench shape on the H200), 64
    for the backward's per-chunk kernels (what spills least, compiled for sm_90a:
    benchmarks/tuning.md).

    From per-kernel device times at B=8, T=4096, H=16, K=V=128, bf16 on the H200 under every
    (BV, warps, stages) of 32/64, 4/8/16, 1/2 (benchmarks/tuning.md): the per-chunk kernels and
    the walks of a scalar gate (or none) are fastest with 4 warps, the walks 1.5-2.5x faster
    pipelined (2 stages); the per-channel walks with 64-wide V-blocks; the pair
    kernels (then on all of K) with 8 from K = 128. The backward's per-chunk kernels
    (`bwd_output`, `bwd_wy`) take 4 warps at every K, though `bwd_wy` spills 0.1-0.7 KB a thread
    (ptxas as launched, K = 128, bf16; `bwd_output` none without a gate, 0.1-0.3 KB with one;
    their tiles are [64, 64] from K = 64 on, one or more key blocks): since the solve's
    gradient left the CUDA cores (`mma_tf32x3`), 4 warps took 1.32 and 1.30 ms against 8 warps'
    2.14 and 1.88 (delta_rule; forward+backward 5.37 against 6.77; gated_delta_rule 6.99 against
    7.91; kda's 1.85 and 1.69 against 2.24 and 2.00) at the bench shape on the H200, and 8 warps
    over 16-wide tiles addressed shared memory out of range or gave wrong gradients there (Triton
    3.6, K = 16). The per-channel walks below K = 64 keep their old 32-wide blocks. The pair kernels
    (programs of 16 rows) take one warp over 32-column key blocks, pipelined: fastest of BK
    16/32/64/128, 1/2/4/8 warps and 1 to 4 stages at the bench shape on the H200, every gradient
    the same bit for bit (benchmarks/tuning.md); the forward's with 2 stages (0.49 ms against
    0.56 at 3 and 0.62 at 1), the gradients' with 3 (1.41 against 1.44 at 2). Their loops read
    loaded gates inside a data-dependent branch, the pattern Triton's pipeliner once raced on
    (triton-lang/triton#8139): the sm_90 compile test's scan (tests/pipeline_races.py) finds no
    such read in them.
    Pipelined loads take twice the shared memory, so the walks pipeline only 16-bit tiles of 64
    <= K <= 128 (a per-channel backward walk not even then: out of shared memory at K = 128).
    kda's forward walk writes o and so reads q's and the pairs' tiles too: at K = 128, bf16 on
    the H200, 4 warps unpipelined took 2.69 ms for the whole forward without autograd, 8 warps
    pipelined 2.73, unpipelined 2.96, 32-wide V-blocks 2.94-3.49, the forward with the output
    kernel 2.98; in training (the walk storing the states and U as well) 4 warps and 8 pipelined
    were alike (benchmarks/tuning.md). Other ops keep the output kernel.
    V-blocks of the per-chunk kernels are 32 wide (see the module's note on Triton 3.6).
    Without a gate, `bwd_output` pipelines its V-loop for bf16 inputs (2 stages): 1.16 ms against
    1.27 at the bench shape on the H200 (delta_rule); with a gate it spills more and was slower
    (1.81 against 1.75, gated_delta_rule), and with fp16 inputs' split products it spills 252
    bytes a thread pipelined against 88 (ptxas, K = 128; benchmarks/tuning.md).
    With 16-bit inputs and K <= 128 the scalar gates' walks and output kernel take fp16 products
    over 64-wide V-blocks: the walks in one wave at the bench shape (256 programs, two an SM), the
    forward walk pipelined, the backward not (pipelined it spilled 188 bytes a thread and an SM
    held one); the output kernel in 2 stages. On the H200 at the bench shape: the forward walk
    0.49 -> 0.29 ms, the backward 0.81 -> 0.79 (gated_delta_rule 0.95 -> 0.85), the output kernel
    0.36 -> 0.23 (benchmarks/tuning.md). kda's walks (64-wide V-blocks from K = 64, K <= 128)
    take them too: the forward walk 0.97 -> 0.70 ms (spills 492 -> 108 bytes a thread, sm_90a),
    the backward 1.08 -> 0.60 with 4 warps (196 bytes spilled, two programs an SM) and 0.91 with
    8 (none spilled, one an SM), which it keeps without fp16 products."""
    BK = max(16, triton.next_power_of_2(K))
    pipelined = 2 if dtype != torch.float32 and 64 <= BK <= 128 else 1
    per_chunk = dict(BV=32, num_warps=8 if BK > 128 else 4)
    bwd_blocks = dict(BV=32, BK=min(BK, 64), num_warps=4, num_stages=1)
    pairs = dict(BK=min(BK, 32), num_warps=1, num_stages=2)
    pair_grads = dict(pairs, num_stages=3)
    output = per_chunk
    if not channel:
        fwd_walk = bwd_walk = dict(BV=32, num_warps=4, num_stages=pipelined)
        if dtype != torch.float32 and BK <= 128:   # fp16 products (`_fwd_step_fp16` and the like)
            fwd_walk, bwd_walk = dict(fwd_walk, BV=64), dict(bwd_walk, BV=64, num_stages=1)
            output = dict(per_chunk, BV=64, num_stages=2)   # 64 wide: see the module's note
    elif BK >= 64:
        fwd_walk = dict(BV=64, num_warps=4 if BK <= 128 else 8, num_stages=1)
        bwd_walk = dict(BV=64, num_warps=4 if dtype != torch.float32 and BK <= 128 else 8, num_stages=1)
    else:
        fwd_walk = bwd_walk = dict(BV=32, num_warps=4, num_stages=1)
    prepare = dict(per_chunk, BK=min(BK, 64 if channel else 32))
    bwd_output = dict(bwd_blocks, num_stages=2) if dtype == torch.bfloat16 and not gated else bwd_blocks
    return BK, dict(prepare=prepare, output=output, local=per_chunk, fwd_walk=fwd_walk,
                    bwd_walk=bwd_walk, bwd_output=bwd_output, bwd_wy=bwd_blocks, pairs=pairs,
                    pair_grads=pair_grads)


@triton.jit(do_not_specialize=["T"])
def _chunk_cumsum_kernel(x, y, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                         REVERSE: tl.constexpr):
    """y [B, T, H, K]: the inclusive cumsum of x inside each chunk of BT rows (with REVERSE the
    suffix sums), summed in float64 and stored in y's dtype; a program per chunk, (batch, head)
    and block of BK key columns. Each thread holds its column's running sum and walks the rows in
    order, CUMSUM_ROWS rows loaded before any of them is stored (a store may alias a later load,
    so no load is moved above an earlier store: a row at a time, the PTX alternates each row's load
    and store). kda's forward gate at the bench shape on the H200: 0.111 ms against 0.139 for a
    scan across the tile (`tl.cumsum`, through shared memory); 8 / 32 / 64 rows ahead 0.114 /
    0.120 / 0.153 (benchmarks/tuning.md)."""
    i_k, i_c, _, _, _, row = head_program(T, H, tl.cdiv(K, BK), tl.cdiv(T, BT))
    acc = tl.zeros([BK], dtype=tl.float64)
    for r0 in tl.static_range(0, BT, CUMSUM_ROWS):
        rows = ()
        for r in tl.static_range(r0, r0 + CUMSUM_ROWS):
            rows = rows + (load_row(x, row * K, _walked_row(i_c, r, BT, REVERSE), T, H, K, BK, i_k),)
        for r in tl.static_range(r0, r0 + CUMSUM_ROWS):
            acc += rows[r - r0].to(tl.float64)
            store_row(y, acc, row * K, _walked_row(i_c, r, BT, REVERSE), T, H, K, BK, i_k)


@triton.jit
def _walked_row(i_c, r, BT: tl.constexpr, REVERSE: tl.constexpr):
    """The time of the r-th row `_chunk_cumsum_kernel` walks in chunk i_c: its r-th row, or with
    REVERSE its r-th from the end."""
    return i_c * BT + (BT - 1 - r if REVERSE else r)


def _chunk_cumsum(x: torch.Tensor, chunk: int, dtype: torch.dtype, reverse: bool) -> torch.Tensor:
    """`_chunk_cumsum_kernel` of x [B, T, H, K] into a new tensor of dtype: a thread a column,
    up to 128 columns a program."""
    B, T, H, K = x.shape
    y = torch.empty(B, T, H, K, dtype=dtype, device=x.device)
    BK = min(128, max(32, triton.next_power_of_2(K)))
    launch(_chunk_cumsum_kernel, flat_grid(triton.cdiv(K, BK), triton.cdiv(T, chunk), B * H), x, y, T, H=H,
           K=K, BT=chunk, BK=BK, REVERSE=reverse, num_warps=BK // 32)
    return y


def chunk_cumgate_channels(g: torch.Tensor, chunk: int, inputs: torch.dtype) -> torch.Tensor:
    """[B, T, H, K]: the inclusive cumsum of g [B, T, H, K] inside each chunk of `chunk` rows, in
    float64 for fp32 `inputs` (the pair kernels' differences of it keep float32 precision) and in
    float32 for 16-bit ones (half the bytes; a difference is off by at most half a float32 step of
    |G|, 1.2e-4 at the extreme gate's 3840, under fp16's rounding of 4.9e-4 and bf16's 2e-3)."""
    return _chunk_cumsum(g, chunk, torch.float64 if inputs == torch.float32 else torch.float32, False)


def chunk_reverse_cumsum(x: torch.Tensor, chunk: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, T, H, K] in dtype: the reverse (suffix) cumsum of x [B, T, H, K] inside each chunk of
    `chunk` rows (the gradient of a chunk-local cumsum from that of its result), summed in float64
    and rounded once."""
    return _chunk_cumsum(x, chunk, dtype, True)


def _states_as_tiles(dtype: torch.dtype, g) -> bool:
    """Whether training keeps the states entering each chunk as fp16 tf32 tiles
    (`_store_state_operand`): where the backward reads them only through tf32 products, so that
    every result is the same bit for bit. bf16 inputs without a gate: fp16 inputs split the
    states into two tf32 parts (`_state_product`), and a scalar gate's gradient sums h * dh
    elementwise (`_bwd_output_kernel`'s b_bound). (The state gradients as such tiles too gained
    nothing at the bench shape on the H200: benchmarks/tuning.md.)"""
    return dtype == torch.bfloat16 and g is None


@compiles_ahead
def _forward(ctx, q, k, v, beta, g, scale, initial_state, output_final_state, chunk_offsets=None):
    """(o, the final state or None): the forward kernels. ctx: the autograd context, which keeps
    what the backward reads; None for a forward no backward follows. With a gate per channel the
    walk writes o itself (`_fwd_walk_kernel`), and without autograd it stores neither the states
    nor U."""
    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
    g = None if g is None else g.contiguous()
    h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
    B, T, H, K = q.shape
    V = v.shape[-1]
    N, NT = state_count(B, chunk_offsets), triton.cdiv(T, CHUNK)
    f32 = dict(dtype=torch.float32, device=q.device)
    channel = g is not None and g.dim() == 4
    BK, settings = _settings(K, q.dtype, g is not None, channel)
    modes = dict(H=H, K=K, V=V, BT=CHUNK, BK=BK, GATED=g is not None, CHANNEL=channel,
                 **product_settings(q.dtype))
    gc = Akk = Aqk = None
    if channel:
        gc = chunk_cumgate_channels(g, CHUNK, q.dtype)
        Akk, Aqk = torch.empty(B, T, H, CHUNK, **f32), torch.empty(B, T, H, CHUNK, **f32)
        launch(pairs_kernel, flat_grid(CHUNK // PAIR_BLOCK, NT, B * H), q, k, gc, Akk, Aqk, T, H=H,
               K=K, BT=CHUNK, BC=PAIR_BLOCK, FP32_DOT=modes["FP32_DOT"], **settings["pairs"])
    Ai = torch.empty(B, T, H, CHUNK, **f32)
    fp16_operands = TF32_TILES and not modes["FP32_DOT"]
    prepare = settings["prepare"]
    operands = dict(f32, dtype=torch.float16) if fp16_operands else f32
    tiles = B * H * NT * triton.cdiv(K, prepare["BK"])
    ws, qs, ks = torch.empty(3, tiles, **f32) if fp16_operands else (None, None, None)
    w, u = torch.empty(B, T, H, K, **operands), torch.empty(B, T, H, V, **f32)
    fp16_products = fp16_operands and not channel   # the walks' (`_fwd_step_fp16`, `_bwd_step_fp16`)
    qg = torch.empty(B, T, H, K, **operands) if channel else None
    kg = torch.empty(B, T, H, K, **operands) if channel or fp16_products else None
    launch(_prepare_kernel, flat_grid(NT, B * H), q, k, v, beta, g, gc, Akk, Ai, w, u, qg, kg, ws, qs, ks,
           T, FP16_OPERANDS=fp16_operands, FP16_PRODUCTS=fp16_products, **{**modes, **prepare})

    ht = torch.empty(N, H, K, V, **f32) if output_final_state else None
    o = torch.empty(B, T, H, V, dtype=store_dtype(v.dtype), device=v.device)
    walk = settings["fwd_walk"]
    # the forward walk's fp16 products also with a gate per channel, over 64-wide V-blocks
    walk_fp16 = fp16_products or (fp16_operands and walk["BV"] == 64 and BK <= 128)
    store = ctx is not None or not channel   # the output kernel or the backward reads them
    # U travels to the output kernel and the backward as their tf32 products read it, fp16 with a
    # scale per chunk and V-block, and so do the states where only such products read them
    fp16_states = fp16_operands and not channel and (ctx is None or _states_as_tiles(q.dtype, g))
    half = dict(f32, dtype=torch.float16)
    scales = B * H * NT * triton.cdiv(V, walk["BV"])
    states = torch.empty(B, H, NT, K, V, **(half if fp16_states else f32)) if store else None
    vnew = torch.empty(B, T, H, V, **(half if fp16_operands else f32)) if store else None
    hs = torch.empty(scales, **f32) if fp16_states else None
    us = torch.empty(scales, **f32) if fp16_operands and store else None
    launch(_fwd_walk_kernel, flat_grid(triton.cdiv(V, walk["BV"]), N * H), q, k, qg, kg, g, gc, Aqk, w, u,
           ws, qs, ks, hs, us, h0, ht, states, vnew, o, chunk_offsets, scale, T, NT, USE_H0=h0 is not None,
           STORE_HT=output_final_state, VARLEN=chunk_offsets is not None, STORE=store,
           FP16_OPERANDS=fp16_operands, FP16_STATES=fp16_states, FP16_U=us is not None,
           FP16_PRODUCTS=walk_fp16, BKS=prepare["BK"], **modes, **walk)
    if not channel:
        output = dict(settings["output"], BV=min(settings["output"]["BV"], walk["BV"]))
        launch(_fwd_output_kernel, flat_grid(NT, B * H), q, k, qg, g, gc, Aqk, hs, us, states, vnew, o, scale,
               T, NT, FP16_STATES=fp16_states, FP16_U=us is not None,
               FP16_PRODUCTS=fp16_products and output["BV"] >= 64,   # see the module's note
               BVS=walk["BV"], **modes, **output)
    if ctx is not None:
        save_context(ctx, scale, output_final_state, q, k, v, beta, g, gc, Akk, Aqk, Ai, w, qg, kg, ws, qs,
                     ks, states, hs, vnew, us, chunk_offsets=chunk_offsets, initial_state=initial_state)
        ctx.set_materialize_grads(False)
    return o.to(v.dtype), ht


class ChunkDeltaInference:
    """`ChunkDeltaFunction`'s forward where no gradient is asked for (grad mode off, or no input
    requiring one): the same kernels without an autograd context, so nothing is kept for a
    backward."""

    @staticmethod
    def apply(*args):
        return _forward(None, *args)


class ChunkDeltaFunction(torch.autograd.Function):
    """Autograd wrapper around the chunked kernels.

    g: None (delta_rule; its gradient is None), [B, T, H] (gated_delta_rule) or [B, T, H, K] (kda:
    its pair matrices come from chunk_pairs.py's kernels). chunk_offsets:
    None, or those of a packed batch's sequences on its aligned row (B = 1, ops/common/varlen.py):
    initial and final state [N, H, K, V].
    """
    forward = staticmethod(_forward)

    @staticmethod
    @compiles_ahead
    def backward(ctx, do, dht):
        q, k, v, beta, g, gc, Akk, Aqk, Ai, w, qg, kg, ws, qs, ks, states, hs, vnew, us = ctx.saved_tensors
        need_h0 = ctx.needs_input_grad[6] and ctx.h0_dtype is not None
        B, T, H, K = q.shape
        V = v.shape[-1]
        N, NT = state_count(B, ctx.chunk_offsets), triton.cdiv(T, CHUNK)
        f32 = dict(dtype=torch.float32, device=q.device)
        channel = gc is not None
        BK, settings = _settings(K, q.dtype, g is not None, channel)
        modes = dict(H=H, K=K, V=V, BT=CHUNK, BK=BK, GATED=g is not None, CHANNEL=channel,
                     **product_settings(q.dtype))
        do, dht = upstream(ctx, v, do, dht)

        dhs = torch.empty(B, H, NT, K, V, **f32)
        dvnew = torch.empty(B, T, H, V, **f32)
        dh0 = torch.empty(N, H, K, V, **f32) if need_h0 else None
        launch(_bwd_local_kernel, flat_grid(NT, B * H), q, k, g, gc, Aqk, do, dvnew, ctx.scale, T, **modes,
               **settings["local"])
        walk = settings["bwd_walk"]
        # dU as the tf32 products of the per-chunk kernels read it, where they read it so alone
        # (bf16 inputs: fp16 ones split it into two tf32 parts in the WY kernel, `_state_product`):
        # half the bytes of the walk's store and of its two readers' loads. (The scalar gates'
        # walk pipelined in tf32 products once spilled 300 bytes a thread more with it; in fp16
        # products, unpipelined, it spills no more: benchmarks/tuning.md)
        fp16_du = ws is not None and q.dtype == torch.bfloat16
        assert not fp16_du or walk["BV"] == settings["fwd_walk"]["BV"], "U and dU tiles share their scales' width"
        du = torch.empty(B, T, H, V, dtype=torch.float16, device=q.device) if fp16_du else dvnew
        dus = torch.empty(B * H * NT * triton.cdiv(V, walk["BV"]), **f32) if fp16_du else None
        launch(_bwd_walk_kernel, flat_grid(triton.cdiv(V, walk["BV"]), N * H), q, k, qg, kg, g, gc, w, ws, qs,
               ks, do, dht, dhs, dvnew, du, dus, dh0, ctx.chunk_offsets, ctx.scale, T, NT,
               USE_DHT=dht is not None, STORE_DH0=need_h0, VARLEN=ctx.chunk_offsets is not None,
               FP16_OPERANDS=ws is not None, FP16_DU=fp16_du,
               FP16_PRODUCTS=ws is not None and (not channel or walk["BV"] == 64 and BK <= 128),
               BKS=settings["prepare"]["BK"], **modes, **walk)

        # dk is float32 until the last kernel adds to it and stores it whole (dk_out); dq too with a
        # gate per channel (the pair kernel adds to dq, dk and dG), dG until its reverse cumsum;
        # the per-chunk kernels take K a key block at a time
        NK = triton.cdiv(K, settings["bwd_output"]["BK"])
        dq = torch.empty(q.shape, dtype=torch.float32 if channel else store_dtype(q.dtype), device=q.device)
        dk, dw = torch.empty(k.shape, **f32), torch.empty(k.shape, **f32)
        dk_out = torch.empty(k.shape, dtype=store_dtype(k.dtype), device=k.device)
        dq_out = torch.empty(q.shape, dtype=store_dtype(q.dtype), device=q.device) if channel else dq
        dv = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=v.device)
        dbeta = torch.empty(beta.shape, dtype=store_dtype(beta.dtype), device=beta.device)
        dg = None if g is None else torch.empty(g.shape, dtype=torch.float32 if channel else store_dtype(g.dtype),
                                                device=g.device)
        dgk = torch.empty(B, T, H, NK, **f32) if g is not None and not channel else None
        pairs = None if channel else torch.empty(B, T, H, NK * CHUNK, **f32)
        dAqk, dAkk = (torch.empty(B, T, H, CHUNK, **f32) for _ in range(2)) if channel else (None, None)
        launch(_bwd_output_kernel, flat_grid(NK, NT, B * H), q, k, g, gc, states, hs, vnew, us, do, dhs, du,
               dus, pairs, dAqk, dq, dk, dw, dg, dgk, ctx.scale, T, NT, FP16_STATES=hs is not None,
               FP16_U=us is not None, FP16_DU=fp16_du, BVS=settings["fwd_walk"]["BV"],
               **{**modes, **settings["bwd_output"]})
        launch(_bwd_wy_kernel, flat_grid(NT, B * H), k, v, beta, g, gc, Akk, Ai, du, dus, dw, pairs, dAkk,
               dk, dk if channel else dk_out, dv, dbeta, dg, dgk, T, NT, FP16_DU=fp16_du, BVS=walk["BV"],
               **{**modes, **settings["bwd_wy"]})
        if channel:
            grads = settings["pair_grads"]
            blocks = triton.cdiv(K, grads["BK"]) * (CHUNK // PAIR_BLOCK)
            launch(pair_grads_kernel, flat_grid(blocks, NT, B * H), q, k, gc, dAqk, dAkk, dq, dk, dq_out, dk_out,
                   dg, T, H=H, K=K, BT=CHUNK, BC=PAIR_BLOCK, FP32_DOT=modes["FP32_DOT"], **grads)
            dg = chunk_reverse_cumsum(dg, CHUNK, store_dtype(g.dtype))
        return needed(ctx, dq_out.to(q.dtype), dk_out.to(k.dtype), dv.to(v.dtype), dbeta.to(beta.dtype),
                      None if g is None else dg.to(g.dtype), None,
                      dh0.to(ctx.h0_dtype) if need_h0 else None, None, None)


def chunk_delta(q, k, v, beta, g, scale, initial_state, output_final_state, cu_seqlens=None):
    """The shared launcher; the public functions check their arguments and call this.

    g: None, [B, T, H] or [B, T, H, K]. cu_seqlens: None, or a packed batch's checked sequence starts (host
    ints, `check_inputs`'s sizes["cu_seqlens"]), run on its aligned row (ops/common/varlen.py).
    """
    K = q.shape[-1]
    scale = K ** -0.5 if scale is None else float(scale)
    packing = None if cu_seqlens is None else Packing(cu_seqlens, CHUNK, q.device)
    tensors = (q, k, v, beta, g, initial_state)
    training = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)
    return apply_packed(ChunkDeltaFunction if training else ChunkDeltaInference, packing,
                        (q, k, v, beta, g), (True,) * 5, scale, initial_state, bool(output_final_state))
