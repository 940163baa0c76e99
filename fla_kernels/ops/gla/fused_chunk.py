"""GLA, fused chunk: one kernel walks a sequence's chunks in order with the state in registers.

Per (batch, head), with state S of shape [K, V]:
    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t
    o_t = scale * q_t S_t

Chunks are BT = 16 tokens, one gate block: P (inclusive prefix) and Q
(exclusive suffix) come from block_gate_sums(g, 16), so every gate sum is
chunk-local. With h the state entering a chunk, p_i = sum_{s <= i} g_s and
s_j = sum_{s > j} g_s inside it:
    o_i = scale * ((q_i * exp(p_i)) h + sum_{j <= i} A_ij v_j)
    A_ij = sum_d q_id k_jd exp(p_id - p_jd)     (computed element-wise, j < i; A_ii = q_i . k_i)
    h <- diag(exp(p_last)) h + (k * exp(s))^T v
Every exponent is p_i, s_j, p_last or p_i - p_j with i >= j inside one block:
all <= 0 (exp_nonpos absorbs rounding). Upstream's fused_chunk_gla went NaN at
T = 43884 with strong decay because it exponentiated differences of
unguarded cumulative gates (exp(-G) factors); nothing here can exceed 1.

Kernels, one program per (K-block, V-block, b*h):
- _fused_fwd_kernel: forward walk; o (a partial sum per K-block) and the final state.
- _fused_bwd_dq_kernel: forward walk recomputing the state; dq (partial per V-block)
  and sum_v (h_T - k_L^T v_L) * dht, the final boundary term of dg.
- _fused_bwd_dkv_kernel: reverse walk with dh in registers; dk (per V-block),
  dv (per K-block) and dh0.
dg: for the recurrence read as q_t S_t and t in a 64-token block,
dg_t = sum_{t <= s in the block} (q_s dq_s - k_s dk_s) + sum_v h * dh, with h the
state leaving the block and dh its gradient (chunk_gate_grad). The dq walk
stores h at every interior block end; the dkv walk, which holds dh there,
forms the boundary term. Nothing is summed across blocks, so dg's error does
not grow with T (a suffix sum over the whole sequence did: at T = 43884 in
bf16 it exceeded the bound). The gate-free terms (the diagonal pairs q_i k_i,
the last token's own path into the final state) are left out of both sides,
as the chunked kernels do, so dg keeps its precision when strong decay makes
it tiny. The products that carry a state into dg take split-bf16 operands (`mma_split`, about
16 bits): the dq walk's do h^T and its state update, the dkv walk's v dh^T and its updates of dh.
Every row of a block shares the boundary term and the states, so one 16-bit rounding of a state
operand, the same for every row, biased dg's sums over tokens (bf16: 22 times their bound on the
H100, 11% off) while each element stayed inside its own. Transposes are only ever
taken of loaded tiles, never of a dot's result (a transposed dot result fed to
another dot was miscompiled on Hopper by some triton versions): where a
transposed state is needed it is carried transposed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.autograd import apply_checked, input_grads, save_context, upstream
from fla_kernels.ops.common.chunk_state import (block_gate_sums, block_total, exp_nonpos,
                                                load_prefix, load_prefix_row)
from fla_kernels.ops.common.dot import add_rounded, mma, mma_split
from fla_kernels.ops.common.gate_grad import chunk_gate_grad
from fla_kernels.ops.common.launch import LaunchSizes, compiles_ahead, flat_grid, launch
from fla_kernels.ops.common.partials import sum_parts
from fla_kernels.ops.common.tiles import (diagonal, flat_heads, head_program, initial_block,
                                          load_row, load_rows, load_state, store_rows, store_state)
from fla_kernels.ops.gla.chunk import GLA_LAYOUTS
from fla_kernels.precision import store_dtype

BT = 16        # tokens per chunk (= gate block)
GATE_GRAD_BT = 64  # rows per block of the dg sums
STEPS = GATE_GRAD_BT // BT  # chunks per dg block


@triton.jit
def _diag_block_scores(b_q, b_pre, b_diag, k, P, base, t0, T, H: tl.constexpr, K: tl.constexpr,
                       BC: tl.constexpr, BK: tl.constexpr, i_k):
    """[BC, BC] scores of one gate block (rows and columns t0..t0+BC-1) over one K-block, element-wise.

    b_q [BC, BK] the query rows, b_pre [BC, BK] their block-local gate prefix
    (inclusive or exclusive), b_diag [BC] the values on the diagonal. Below it,
    column j holds sum_d q_id k_jd exp(pre_id - pre+_jd) with pre+ the inclusive
    prefix of row j: a difference inside one gate block, <= 0, taken one column
    at a time so nothing is factored out and nothing can overflow.
    """
    o_i = tl.arange(0, BC)
    b_A = tl.where(o_i[:, None] == o_i[None, :], b_diag[:, None], 0.0)
    for j in range(BC):
        b_kj = load_row(k, base, t0 + j, T, H, K, BK, i_k)
        b_prej = load_prefix_row(P, base, t0 + j, T, H, K, BK, i_k, BC, False)
        b_s = b_q * b_kj[None, :] * exp_nonpos(b_pre - b_prej[None, :])
        b_col = tl.sum(tl.where(o_i[:, None] > j, b_s, 0.0), axis=1)
        b_A += tl.where(o_i[None, :] == j, b_col[:, None], 0.0)
    return b_A


@triton.jit
def _chunk_tiles(q, k, v, P, Q, row, c0, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, i_k, i_v):
    """q, k, v, the inclusive prefix p and exclusive suffix s of the gate ([BT, BK] or [BT, BV]
    float32) and its total ([BK]) of the chunk at c0, for the program of (b, h) at `row`."""
    base_k = row * K
    b_q = load_rows(q, base_k, c0, T, H, K, BT, BK, i_k)
    b_k = load_rows(k, base_k, c0, T, H, K, BT, BK, i_k)
    b_v = load_rows(v, row * V, c0, T, H, V, BT, BV, i_v)
    b_p = load_prefix(P, base_k, c0, T, H, K, BT, BK, i_k, BT, False)
    b_s = load_rows(Q, base_k, c0, T, H, K, BT, BK, i_k)
    b_tot = block_total(P, base_k, c0, T, H, K, BK, i_k, BT)
    return b_q, b_k, b_v, b_p, b_s, b_tot


@triton.jit
def _keys_into_state(b_k, b_s, c0, T, BT: tl.constexpr):
    """k * exp(s), the chunk's keys as they enter the state leaving it, less the last token's:
    its own k^T v is added to the final state apart (see the backward's boundary term)."""
    return tl.where((c0 + tl.arange(0, BT) == T - 1)[:, None], 0.0, b_k * exp_nonpos(b_s))


@triton.jit
def _part_base(i_part, base, heads, T, D: tl.constexpr):
    """The offset of a program's (b, h) in part i_part of partials [N, B, T, H, D], from its
    offset `base` in a [B, T, H, D] tensor; heads = B * H."""
    return i_part.to(tl.int64) * heads * T * D + base


@triton.jit(do_not_specialize=["T", "NT"])
def _fused_fwd_kernel(q, k, v, P, Q, h0, o, ht, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                      V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      USE_H0: tl.constexpr, STORE_HT: tl.constexpr, FP32_DOT: tl.constexpr,
                      OPERAND_DTYPE: tl.constexpr):
    """o[i_k] (the K-block's part of o, [NK, B, T, H, V]) and the final state, walking the chunks.
    The decayed keys k * exp(s) enter the state's product as rounded tf32, as in chunk's walks
    (`chunk_state._walk_step`): as bf16 operands they left ht at 0.50 of its bound against
    chunk's 0.05 (emulated tensor cores, gla bf16, T = 65 and 300; the H200 gate alike)."""
    i_k, i_v, i_bh, i_b, i_h, row = head_program(T, H, tl.cdiv(K, BK), tl.cdiv(V, BV))
    base_k, base_v = row * K, row * V
    base_o = _part_base(i_k, base_v, flat_heads(tl.cdiv(K, BK), tl.cdiv(V, BV)), T, V)
    b_h = initial_block(h0, i_bh, K, V, BK, BV, i_k, i_v, USE_H0, False)
    for i_c in range(NT):
        c0 = i_c * BT
        b_q, b_k, b_v, b_p, b_s, b_tot = _chunk_tiles(q, k, v, P, Q, row, c0, T, H, K, V, BT, BK,
                                                      BV, i_k, i_v)
        b_A = _diag_block_scores(b_q, b_p, tl.sum(b_q * b_k, axis=1), k, P, base_k, c0, T, H, K,
                                BT, BK, i_k)
        b_o = mma(b_q * exp_nonpos(b_p), b_h, FP32_DOT, OPERAND_DTYPE)
        b_o += mma(b_A, b_v, FP32_DOT, OPERAND_DTYPE)
        store_rows(o, b_o * scale, base_o, c0, T, H, V, BT, BV, i_v)
        b_kd = _keys_into_state(b_k, b_s, c0, T, BT)
        b_h = add_rounded(b_h * exp_nonpos(b_tot)[:, None],
                          mma(tl.trans(b_kd), b_v, FP32_DOT, tl.float32))
    if STORE_HT:
        b_kl = load_row(k, base_k, T - 1, T, H, K, BK, i_k)
        b_vl = load_row(v, base_v, T - 1, T, H, V, BV, i_v)
        store_state(ht, i_bh, b_h + b_kl[:, None] * b_vl[None, :], K, V, BK, BV, i_k, i_v, False)


@triton.jit
def _store_boundary(boundary, val, i_v, i_bh, heads, block, NB, K: tl.constexpr, BK: tl.constexpr,
                    i_k):
    """boundary[i_v, b, h, block, K-block i_k] = val ([BK]); boundary is [NV, B, H, NB, K], heads
    = B * H."""
    o_k = i_k * BK + tl.arange(0, BK)
    row = (i_v.to(tl.int64) * heads + i_bh) * NB + block
    tl.store(boundary + row * K + o_k, val, mask=o_k < K)


@triton.jit(do_not_specialize=["T", "NT", "NB"])
def _fused_bwd_dq_kernel(q, k, v, P, Q, h0, do, dht, dqs, dq, states, boundary, scale, T, NT, NB,
                         H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, STEPS: tl.constexpr,
                         USE_H0: tl.constexpr, USE_DHT: tl.constexpr, FP32_DOT: tl.constexpr,
                         OPERAND_DTYPE: tl.constexpr):
    """dq by a forward walk; the V-block's parts, [NV, B, T, H, K].

    dqs_i = scale * exp(p_i) * (do_i h^T) + sum_{j < i} dA_ij k_j exp(p_i - p_j) (gated paths only;
    dA = scale * do v^T), dq = dqs + dA_ii k_i. The state leaving every dg block but the last
    goes to states[b, h, block]; boundary[i_v, b, h, NB - 1] = sum_v (h_T - k_L^T v_L) * dht.
    The state is carried transposed, [BV, BK], so no dot's result is ever transposed.
    """
    i_k, i_v, i_bh, i_b, i_h, row = head_program(T, H, tl.cdiv(K, BK), tl.cdiv(V, BV))
    base_k, base_v = row * K, row * V
    heads = flat_heads(tl.cdiv(K, BK), tl.cdiv(V, BV))
    base_p = _part_base(i_v, base_k, heads, T, K)
    o_t = tl.arange(0, BT)
    b_ht = initial_block(h0, i_bh, K, V, BK, BV, i_k, i_v, USE_H0, True)
    for i_c in range(NT):
        c0 = i_c * BT
        b_q, b_k, b_v, b_p, b_s, b_tot = _chunk_tiles(q, k, v, P, Q, row, c0, T, H, K, V, BT, BK,
                                                      BV, i_k, i_v)
        b_do = load_rows(do, base_v, c0, T, H, V, BT, BV, i_v)
        b_dA = mma(b_do, tl.trans(b_v), FP32_DOT, OPERAND_DTYPE) * scale
        b_dq = mma_split(b_do, b_ht, FP32_DOT) * (scale * exp_nonpos(b_p))
        for j in range(BT):
            b_col = tl.sum(tl.where((o_t[None, :] == j) & (o_t[:, None] > j), b_dA, 0.0), axis=1)
            b_kj = load_row(k, base_k, c0 + j, T, H, K, BK, i_k)
            b_pj = load_prefix_row(P, base_k, c0 + j, T, H, K, BK, i_k, BT, False)
            b_dq += b_col[:, None] * b_kj[None, :] * exp_nonpos(b_p - b_pj[None, :])
        b_diag = diagonal(b_dA, BT)
        store_rows(dqs, b_dq, base_p, c0, T, H, K, BT, BK, i_k)
        store_rows(dq, b_dq + b_diag[:, None] * b_k, base_p, c0, T, H, K, BT, BK, i_k)
        b_kd = _keys_into_state(b_k, b_s, c0, T, BT)
        b_ht = add_rounded(b_ht * exp_nonpos(b_tot)[None, :],
                           mma_split(tl.trans(b_v), b_kd, FP32_DOT))
        if ((i_c + 1) % STEPS == 0) & (i_c + 1 < NT):
            store_state(states, i_bh * (NB - 1) + (i_c + 1) // STEPS - 1, b_ht, K, V, BK, BV,
                        i_k, i_v, True)
    b_bound = tl.zeros([BK], dtype=tl.float32)
    if USE_DHT:
        b_bound += tl.sum(b_ht * load_state(dht, i_bh, K, V, BK, BV, i_k, i_v, True), axis=0)
    _store_boundary(boundary, b_bound, i_v, i_bh, heads, NB - 1, NB, K, BK, i_k)


@triton.jit(do_not_specialize=["T", "NT", "NB"])
def _fused_bwd_dkv_kernel(q, k, v, P, Q, do, dht, states, boundary, dks, dk, dv, dh0, scale, T,
                          NT, NB, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                          STEPS: tl.constexpr, USE_DHT: tl.constexpr,
                          STORE_DH0: tl.constexpr, FP32_DOT: tl.constexpr,
                          OPERAND_DTYPE: tl.constexpr):
    """dk (the V-block's part, [NV, ...]), dv (the K-block's part, [NK, ...]) and dh0 by a reverse walk.

    With dh the gradient w.r.t. the state leaving the chunk:
    dks_j = exp(s_j) * (v_j dh^T) + sum_{i > j} dA_ij q_i exp(p_i - p_j) (gated paths only; the last
    token's v_L dht^T is not gated), dk = dks + dA_jj q_j + [j = T - 1] v_j dht^T,
    dv_j = (k_j exp(s_j)) dh + sum_{i >= j} A_ij do_i * scale,
    then dh <- diag(exp(p_last)) dh + scale * (q * exp(p))^T do.
    At every interior dg block end, boundary[i_v, b, h, block] = sum_v h * dh with h from states.
    dh is carried twice, as [BK, BV] and transposed, so no dot's result is ever transposed.
    """
    i_k, i_v, i_bh, i_b, i_h, row = head_program(T, H, tl.cdiv(K, BK), tl.cdiv(V, BV))
    base_k, base_v = row * K, row * V
    heads = flat_heads(tl.cdiv(K, BK), tl.cdiv(V, BV))
    base_pk, base_pv = _part_base(i_v, base_k, heads, T, K), _part_base(i_k, base_v, heads, T, V)
    o_t = tl.arange(0, BT)
    b_dh = initial_block(dht, i_bh, K, V, BK, BV, i_k, i_v, USE_DHT, False)
    b_dht = initial_block(dht, i_bh, K, V, BK, BV, i_k, i_v, USE_DHT, True)
    for i_r in range(NT):
        i_c = NT - 1 - i_r
        c0 = i_c * BT
        if ((i_c + 1) % STEPS == 0) & (i_c + 1 < NT):
            block = (i_c + 1) // STEPS - 1
            b_hb = load_state(states, i_bh * (NB - 1) + block, K, V, BK, BV, i_k, i_v, True)
            _store_boundary(boundary, tl.sum(b_hb * b_dht, axis=0), i_v, i_bh, heads, block, NB, K,
                            BK, i_k)
        b_q, b_k, b_v, b_p, b_s, b_tot = _chunk_tiles(q, k, v, P, Q, row, c0, T, H, K, V, BT, BK,
                                                      BV, i_k, i_v)
        b_do = load_rows(do, base_v, c0, T, H, V, BT, BV, i_v)
        b_decay = exp_nonpos(b_s)
        b_A = _diag_block_scores(b_q, b_p, tl.sum(b_q * b_k, axis=1), k, P, base_k, c0, T, H, K,
                                BT, BK, i_k)
        b_dv = mma(tl.trans(b_A), b_do * scale, FP32_DOT, OPERAND_DTYPE)
        b_dv += mma(b_k * b_decay, b_dh, FP32_DOT, OPERAND_DTYPE)
        store_rows(dv, b_dv, base_pv, c0, T, H, V, BT, BV, i_v)

        b_dA = mma(b_do, tl.trans(b_v), FP32_DOT, OPERAND_DTYPE) * scale
        b_dk = mma_split(b_v, b_dht, FP32_DOT) * b_decay
        is_final = (c0 + o_t == T - 1)[:, None]
        b_dk_final = tl.where(is_final, b_dk, 0.0)
        b_dk = tl.where(is_final, 0.0, b_dk)
        for i in range(BT):
            b_row = tl.sum(tl.where((o_t[:, None] == i) & (o_t[None, :] < i), b_dA, 0.0), axis=0)
            b_qi = load_row(q, base_k, c0 + i, T, H, K, BK, i_k)
            b_pi = load_prefix_row(P, base_k, c0 + i, T, H, K, BK, i_k, BT, False)
            b_dk += b_row[:, None] * b_qi[None, :] * exp_nonpos(b_pi[None, :] - b_p)
        b_diag = diagonal(b_dA, BT)
        store_rows(dks, b_dk, base_pk, c0, T, H, K, BT, BK, i_k)
        store_rows(dk, b_dk + b_diag[:, None] * b_q + b_dk_final, base_pk, c0, T, H, K, BT, BK, i_k)

        b_qg = b_q * (scale * exp_nonpos(b_p))
        b_dh = add_rounded(b_dh * exp_nonpos(b_tot)[:, None],
                           mma_split(tl.trans(b_qg), b_do, FP32_DOT))
        b_dht = add_rounded(b_dht * exp_nonpos(b_tot)[None, :],
                            mma_split(tl.trans(b_do), b_qg, FP32_DOT))
    if STORE_DH0:
        store_state(dh0, i_bh, b_dh, K, V, BK, BV, i_k, i_v, False)


# ----------------------------------------------------------------------------- launchers

class _Launch(LaunchSizes):
    """`LaunchSizes` over chunks of BT, with the grid flat_grid(K-blocks, V-blocks, B * H) of every
    kernel."""

    def __init__(self, q, v):
        super().__init__(q, v, BT)
        self.grid = flat_grid(self.NK, self.NV, self.B * self.H)
        self.sizes = dict(BT=BT, BK=self.BK, BV=self.BV)


def _parts(n, like, shape=None):
    """n partial sums of a `like`-shaped result: float32 to be summed, or written once in place."""
    shape = like.shape if shape is None else shape
    dtype = store_dtype(like.dtype) if n == 1 else torch.float32
    return torch.empty(n, *shape, dtype=dtype, device=like.device)


def _forward(q, k, v, g, scale, initial_state, output_final_state):
    L = _Launch(q, v)
    P, Q = block_gate_sums(g, BT)
    o = _parts(L.NK, v)
    ht = torch.empty(L.B, L.H, L.K, L.V, dtype=torch.float32, device=q.device) if output_final_state else None
    launch(_fused_fwd_kernel, L.grid, q, k, v, P, Q, q if initial_state is None else initial_state, o,
           q if ht is None else ht, scale, L.T, L.NT, L.H, L.K, L.V, **L.sizes,
           USE_H0=initial_state is not None, STORE_HT=ht is not None, **L.dots)
    return sum_parts(o, v.dtype), ht


def _backward(q, k, v, g, scale, initial_state, do, dht):
    """(dq, dk, dv, dg, dh0 or None); dht may be None (no gradient from the final state)."""
    L = _Launch(q, v)
    P, Q = block_gate_sums(g, BT)
    h0 = q if initial_state is None else initial_state
    flags = dict(USE_DHT=dht is not None, **L.sizes, **L.dots)
    NB = triton.cdiv(L.T, GATE_GRAD_BT)
    states = torch.empty(L.B, L.H, max(NB - 1, 1), L.K, L.V, dtype=torch.float32, device=q.device)
    boundary = torch.empty(L.NV, L.B, L.H, NB, L.K, dtype=torch.float32, device=q.device)
    dqs = torch.empty(L.NV, *q.shape, dtype=torch.float32, device=q.device)
    dq = _parts(L.NV, q)
    launch(_fused_bwd_dq_kernel, L.grid, q, k, v, P, Q, h0, do, q if dht is None else dht, dqs, dq, states,
           boundary, scale, L.T, L.NT, NB, L.H, L.K, L.V, STEPS=STEPS,
           USE_H0=initial_state is not None, **flags)
    dks = torch.empty(L.NV, *k.shape, dtype=torch.float32, device=q.device)
    dk = _parts(L.NV, k)
    dv = _parts(L.NK, v)
    dh0 = (torch.empty(L.B, L.H, L.K, L.V, dtype=torch.float32, device=q.device)
           if initial_state is not None else None)
    launch(_fused_bwd_dkv_kernel, L.grid, q, k, v, P, Q, do, q if dht is None else dht, states, boundary,
           dks, dk, dv, q if dh0 is None else dh0, scale, L.T, L.NT, NB,
           L.H, L.K, L.V, STEPS=STEPS, STORE_DH0=dh0 is not None, **flags)
    dqs, dks = sum_parts(dqs, torch.float32), sum_parts(dks, torch.float32)
    dg = chunk_gate_grad(q, dqs, k, dks, boundary.sum(0), GATE_GRAD_BT, q_reads_current=True,
                         out_dtype=store_dtype(g.dtype))
    return sum_parts(dq, q.dtype), sum_parts(dk, k.dtype), sum_parts(dv, v.dtype), dg.to(g.dtype), dh0


class FusedChunkGLAFunction(torch.autograd.Function):
    """Autograd wrapper: saves only the inputs; the backward walks recompute the states."""

    @staticmethod
    def parts_per_row(tensors) -> int:
        """The backward's float32 partials per batch entry: dq, dk, dq', dk' per V-block and dv
        per K-block (ops/common/batch_groups.py)."""
        L = _Launch(tensors[0], tensors[2])
        return L.T * L.H * (4 * L.NV * L.K + L.NK * L.V)

    @staticmethod
    @compiles_ahead
    def forward(ctx, q, k, v, g, scale, initial_state, output_final_state):
        o, ht = _forward(q, k, v, g, scale, initial_state, output_final_state)
        save_context(ctx, scale, output_final_state, q, k, v, g, initial_state)
        return o, ht

    @staticmethod
    @compiles_ahead
    def backward(ctx, do, dht):
        q, k, v, g, initial_state = ctx.saved_tensors
        do, dht = upstream(ctx, v, do, dht)
        dq, dk, dv, dg, dh0 = _backward(q, k, v, g, ctx.scale, initial_state, do, dht)
        return input_grads(ctx, (dq, dk, dv, dg), dh0, initial_state)


def fused_chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """Fused-chunk GLA: the arguments and results of `chunk_gla` (ops/gla/chunk.py)."""
    return apply_checked(FusedChunkGLAFunction, "fused_chunk_gla", dict(q=q, k=k, v=v, g=g),
                         GLA_LAYOUTS, scale, initial_state, output_final_state)
