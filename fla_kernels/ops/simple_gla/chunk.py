"""Simple GLA, chunked: forward and backward Triton kernels over chunks of BT = 64 tokens.

Per (batch, head), with state S of shape [K, V] and one log gate g_t per head and step:
    S_t = exp(g_t) S_{t-1} + k_t^T v_t,     o_t = scale * q_t S_t
With g = None (USE_G off) there is no decay: plain linear attention.

Inside chunk c (rows i, j = 0..BT-1), with h_c the state entering it and G the
inclusive chunk-local cumulative gate (L the chunk's last row):
    o_i     = scale * (exp(G_i) q_i h_c + sum_{j <= i} (q_i . k_j) exp(G_i - G_j) v_j)
    h_{c+1} = exp(G_L) h_c + sum_j exp(G_L - G_j) k_j^T v_j
The intra-chunk scores are one [BT, BT] `tl.dot` of q and k times a decay
matrix. G is summed in float64 (BT values per program, cheap), so a
difference G_i - G_j keeps full float32 precision even when the chunk sums
to thousands (strong decay), and only differences with i >= j, which are
<= 0, are exponentiated: the others are masked before the exponential.
The chunk-to-chunk states come from ops/common/chunk_state.py (its scalar-gate
path: the same float64 chunk cumsum, broadcast over K).

Forward:  chunk_fwd_h (states, stored in bf16 for bf16 inputs) -> _fwd_o_kernel (o).
Backward: states recomputed; chunk_bwd_dh (dh, dh0) -> _bwd_dv_kernel (dv)
          -> _bwd_dqkg_kernel (dq, dk and per-K-block partials of dg). States are stored
          in bf16 for bf16 inputs without a gate, else in float32 (dg reads them
          element-wise); dh always in float32 (`_bwd_dv_kernel` says why).
A packed batch (cu_seqlens) runs on its chunk-aligned row (ops/common/varlen.py): the two state
walks take its sequences' chunk offsets, the other kernels run as they are.
Products of two loaded 16-bit tiles take their own dtype (exact); products of a dot's
result take rounded tf32 operands (`_Launch` says why), except, with a gate, dA's products with
k and q, which take two (`mma_tf32_split`: see the gate gradient below).

The gate gradient. Summing the per-channel identity (ops/common/gate_grad.py)
over K gives, for t in chunk c,
    dg_t = sum(h_{c+1} * dh_c) + sum_{t <= s <= L} (q_s . dq_s - k_s . dk_s)
with dh_c the gradient w.r.t. the state leaving the chunk. Terms with no gate
in them cancel there only in exact arithmetic: the diagonal score
scale (q_s . k_s)(do_s . v_s) sits in both q_s . dq_s and k_s . dk_s, and the
last row's own path k_L^T v_L into h_{c+1} sits in the boundary term and in
k_L . dk_L. Under strong decay they are O(1) while dg is tiny, so the kernel
leaves them out of both sides (dq', dk', boundary') before the chunk-local
reverse cumsum; every term left carries a gate of the chunk. Two things keep dg's sums over
tokens unbiased in 16-bit (one rounding shared by every row of a chunk had put them at 24 times
their bound on the H100, fp16, while each element passed): boundary' is exp(G_L) sum(h_c * dh_c)
plus the rows' k_j . dk_j through the state, the very products the cumsum subtracts, so those
cancel to the last bit; and the pairs (i, j) that straddle a row t, terms of dg_t, are products
of about 21 bits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_kernels.ops.common.autograd import apply_checked, input_grads, save_context, upstream
from fla_kernels.ops.common.chunk_state import (chunk_bwd_dh, chunk_cumgate, chunk_fwd_h, exp_nonpos,
                                                through_states)
from fla_kernels.ops.common.dot import mma, mma_tf32_split, mma_tf32_split_rhs
from fla_kernels.ops.common.launch import (LaunchSizes, compiles_ahead, flat_grid, launch,
                                          tuned_blocks)
from fla_kernels.ops.common.partials import sum_parts
from fla_kernels.ops.common.tiles import (diagonal, head_program, load_rows, load_rows_t,
                                          load_state, store_rows)
from fla_kernels.precision import product_settings, store_dtype
from fla_kernels.utils import check_inputs

BT = 64  # tokens per chunk
# the inputs' dimensions (`check_inputs`); g may be None, and linear attention passes it as None;
# g_gamma, the constant per-head decay, stands for g (`decay_gate`)
SIMPLE_GLA_LAYOUTS = dict(q="BTHK", k="BTHK", v="BTHV", g="BTH", g_gamma="H")


# ----------------------------------------------------------------------------- gates

@triton.jit
def decay_matrix(G_plus, G_minus, mask):
    """exp(G_plus - G_minus) (float64 operands broadcast to a matrix) where mask holds (the
    exponent is <= 0 there), else 0. The difference is masked before the exponential."""
    diff = (G_plus - G_minus).to(tl.float32)
    return tl.where(mask, exp_nonpos(tl.where(mask, diff, 0.0)), 0.0)


# ----------------------------------------------------------------------------- kernels

@triton.jit(do_not_specialize=["T", "NT"])
def _fwd_o_kernel(q, k, v, g, states, o, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                  V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  USE_G: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr,
                  INPUT_DTYPE: tl.constexpr, STATE_DTYPE: tl.constexpr):
    """o = scale * (exp(G) * (q h_c) + ((q k^T) * decay) v), one program per (V-block, chunk, b*h).

    Operands: q k^T in INPUT_DTYPE (loaded inputs: exact products), q h_c in STATE_DTYPE (the
    stored states' dtype, or tf32 for float32 ones), the scores times v in OPERAND_DTYPE."""
    i_v, i_c, i_bh, i_b, i_h, row = head_program(T, H, tl.cdiv(V, BV), NT)
    base_k, base_v = row * K, row * V
    c0 = i_c * BT
    o_i = tl.arange(0, BT)
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_q = load_rows(q, base_k, c0, T, H, K, BT, BK, i_k)
        b_k = load_rows(k, base_k, c0, T, H, K, BT, BK, i_k)
        b_h = load_state(states, i_bh * NT + i_c, K, V, BK, BV, i_k, i_v, False)
        b_o += mma(b_q, b_h, FP32_DOT, STATE_DTYPE)
        b_A += mma(b_q, tl.trans(b_k), FP32_DOT, INPUT_DTYPE)
    causal = o_i[:, None] >= o_i[None, :]
    if USE_G:
        b_G, _ = chunk_cumgate(g, i_b, i_h, c0, T, H, BT)
        b_o *= exp_nonpos(b_G.to(tl.float32))[:, None]
        b_A *= decay_matrix(b_G[:, None], b_G[None, :], causal)
    b_A = tl.where(causal, b_A, 0.0)
    b_v = load_rows(v, base_v, c0, T, H, V, BT, BV, i_v)
    b_o += mma(b_A, b_v, FP32_DOT, OPERAND_DTYPE)
    store_rows(o, b_o * scale, base_v, c0, T, H, V, BT, BV, i_v)


@triton.jit(do_not_specialize=["T", "NT"])
def _bwd_dv_kernel(q, k, g, do, dh, dv, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                   V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   USE_G: tl.constexpr, FP32_DOT: tl.constexpr, OPERAND_DTYPE: tl.constexpr,
                   INPUT_DTYPE: tl.constexpr, STATE_DTYPE: tl.constexpr):
    """dv_j = scale * sum_{i >= j} (q_i . k_j) exp(G_i - G_j) do_i + exp(G_L - G_j) k_j dh_c,
    one program per (V-block, chunk, b*h); dh_c is the gradient w.r.t. the state leaving chunk c.
    The transposed scores are their own dot (k q^T), not the transpose of another dot's result.
    Operands as in `_fwd_o_kernel` (dh for the states), except k dh_c without a gate: every row
    of the chunk takes dh_c at full weight, so one rounding of it adds up over the rows' sum
    where the keys share a sign (positive feature maps); dh_c is float32 there and the product
    keeps about 21 bits of it (`mma_tf32_split_rhs`)."""
    i_v, i_c, i_bh, i_b, i_h, row = head_program(T, H, tl.cdiv(V, BV), NT)
    base_k, base_v = row * K, row * V
    c0 = i_c * BT
    o_i = tl.arange(0, BT)
    b_At = tl.zeros([BT, BT], dtype=tl.float32)  # [j, i]
    b_dv = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_q = load_rows(q, base_k, c0, T, H, K, BT, BK, i_k)
        b_k = load_rows(k, base_k, c0, T, H, K, BT, BK, i_k)
        b_dh = load_state(dh, i_bh * NT + i_c, K, V, BK, BV, i_k, i_v, False)
        b_At += mma(b_k, tl.trans(b_q), FP32_DOT, INPUT_DTYPE)
        if USE_G:
            b_dv += mma(b_k, b_dh, FP32_DOT, STATE_DTYPE)
        else:
            b_dv += mma_tf32_split_rhs(b_k, b_dh, FP32_DOT)
    causal_t = o_i[:, None] <= o_i[None, :]  # j <= i
    if USE_G:
        b_G, b_GL = chunk_cumgate(g, i_b, i_h, c0, T, H, BT)
        b_dv *= exp_nonpos((b_GL - b_G).to(tl.float32))[:, None]
        b_At *= decay_matrix(b_G[None, :], b_G[:, None], causal_t)
    b_At = tl.where(causal_t, b_At, 0.0)
    b_do = load_rows(do, base_v, c0, T, H, V, BT, BV, i_v)
    b_dv += mma(b_At * scale, b_do, FP32_DOT, OPERAND_DTYPE)
    store_rows(dv, b_dv, base_v, c0, T, H, V, BT, BV, i_v)


@triton.jit(do_not_specialize=["T", "NT", "B"])
def _bwd_dqkg_kernel(q, k, v, g, do, states, dh, dq, dk, dg_part, scale, T, NT, B, H: tl.constexpr,
                     K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                     BV: tl.constexpr, USE_G: tl.constexpr, FP32_DOT: tl.constexpr,
                     OPERAND_DTYPE: tl.constexpr, INPUT_DTYPE: tl.constexpr,
                     STATE_DTYPE: tl.constexpr):
    """dq, dk (in their dtype) and, with USE_G, dg_part [NK, B, T, H] float32 (this K-block's share
    of dg), one program per (K-block, chunk, b*h):
        dq_i = scale * exp(G_i) do_i h_c^T + sum_{j <= i} dA_ij k_j
        dk_j = exp(G_L - G_j) v_j dh_c^T + sum_{i >= j} dA_ij q_i
    with dA_ij = scale (do_i . v_j) exp(G_i - G_j). dA and its transpose are two dots of loaded
    tiles (never a transposed dot result). dg: see the module docstring. Operands as in
    `_fwd_o_kernel` (states and dh alike)."""
    i_k, i_c, i_bh, i_b, i_h, row = head_program(T, H, tl.cdiv(K, BK), NT)
    base_k, base_v = row * K, row * V
    c0 = i_c * BT
    o_i = tl.arange(0, BT)
    is_last = (c0 + o_i == tl.minimum(c0 + BT, T) - 1)[:, None]
    b_q = load_rows(q, base_k, c0, T, H, K, BT, BK, i_k)
    b_k = load_rows(k, base_k, c0, T, H, K, BT, BK, i_k)
    if USE_G:
        b_G, b_GL = chunk_cumgate(g, i_b, i_h, c0, T, H, BT)
        b_to_end = exp_nonpos((b_GL - b_G).to(tl.float32))[:, None]
        b_eL = tl.exp(tl.minimum(b_GL.to(tl.float32), 0.0))
    b_dA = tl.zeros([BT, BT], dtype=tl.float32)   # [i, j]
    b_dAt = tl.zeros([BT, BT], dtype=tl.float32)  # [j, i]
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_carried = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_do, b_v, b_dq_v, b_dk_v, b_carried_v = through_states(
            do, v, states, dh, base_v, i_bh * NT + i_c, c0, T, H, K, V, BT, BK, BV, i_k, i_v,
            FP32_DOT, STATE_DTYPE, False)
        b_dot = load_rows_t(do, base_v, c0, T, H, V, BT, BV, i_v)
        b_vt = load_rows_t(v, base_v, c0, T, H, V, BT, BV, i_v)
        b_dA += mma(b_do, b_vt, FP32_DOT, INPUT_DTYPE)
        b_dAt += mma(b_v, b_dot, FP32_DOT, INPUT_DTYPE)
        b_dq += b_dq_v
        b_dk += b_dk_v
        if USE_G:
            b_carried += b_carried_v
    strict = o_i[:, None] > o_i[None, :]
    strict_t = o_i[:, None] < o_i[None, :]
    # the diagonal carries no gate (exp(0) = 1) and is added apart; dA, dA^T keep j < i only
    b_diag = diagonal(b_dA, BT)[:, None] * scale
    b_dq *= scale
    if USE_G:
        b_dq *= exp_nonpos(b_G.to(tl.float32))[:, None]
        b_dk *= b_to_end
        # sum(h_{c+1} * dh_c) without the last row's path: the carried state's part, then the
        # rows' parts from the very products k_j . dk_j that the sums below subtract, so the two
        # cancel to the last bit
        b_bound = b_carried * b_eL + tl.sum(tl.where(is_last, 0.0, b_k * b_dk), axis=0)
        b_dA *= decay_matrix(b_G[:, None], b_G[None, :], strict)
        b_dAt *= decay_matrix(b_G[None, :], b_G[:, None], strict_t)
    b_dA = tl.where(strict, b_dA * scale, 0.0)
    b_dAt = tl.where(strict_t, b_dAt * scale, 0.0)
    if USE_G:
        # the pairs (i, j) straddling a row t are terms of dg_t: split products keep them to
        # about 21 bits (one tf32 rounding of dA left a residue every later row's sum shares)
        b_dqs = b_dq + mma_tf32_split(b_dA, b_k, FP32_DOT)
        b_dks = b_dk + mma_tf32_split(b_dAt, b_q, FP32_DOT)
    else:
        b_dqs = b_dq + mma(b_dA, b_k, FP32_DOT, OPERAND_DTYPE)
        b_dks = b_dk + mma(b_dAt, b_q, FP32_DOT, OPERAND_DTYPE)
    store_rows(dq, b_dqs + b_diag * b_k, base_k, c0, T, H, K, BT, BK, i_k)
    store_rows(dk, b_dks + b_diag * b_q, base_k, c0, T, H, K, BT, BK, i_k)
    if USE_G:
        b_dks = tl.where(is_last, 0.0, b_dks)  # the last row's own path into h_{c+1}
        b_a = tl.sum(b_q * b_dqs - b_k * b_dks, axis=1)
        b_dg = tl.cumsum(b_a, axis=0, reverse=True) + tl.sum(b_bound, axis=0)
        t = c0 + o_i
        tl.store(dg_part + ((i_k * B + i_b) * T + t.to(tl.int64)) * H + i_h, b_dg, mask=t < T)


# ----------------------------------------------------------------------------- launchers

# Block caps and launch options per kernel, the fastest of a sweep on the H100 at K = V = 128 whose
# results matched (benchmarks/tuning.md; _fwd_o_kernel with BK 128, BV 32 and eight warps gave wrong
# o there). Blocks of 64 along both K and V need more than the H100's 227 KB of shared memory in
# _bwd_dqkg_kernel with float32 (tf32) operands.
TUNING = {
    "fwd_h": dict(BK=128, BV=64, num_warps=4, num_stages=2),
    "bwd_dh": dict(BK=64, BV=64),
    "fwd_o": dict(BK=128, BV=64, num_warps=4, num_stages=2),
    "bwd_dv": dict(BK=32, BV=64, num_warps=4, num_stages=3),
    "bwd_dqkg": dict(BK=64, BV=32, num_warps=4, num_stages=2),
}


class _Launch(LaunchSizes):
    """`LaunchSizes` over chunks of BT, with tf32 products, the operand dtypes and the tuned
    blocks of each kernel."""

    def __init__(self, q, v):
        # Products of a dot's result (the scores, dA) take tf32 operands for 16-bit inputs, never
        # bf16 / fp16 ones. With bf16 operands throughout, the H100 (triton 3.6) gave wrong o in
        # rows 16..63 of every chunk (the rows of warps 1-3) when the K loop ran once and BV <= 32
        # (K=64/V=16, K=64/V=32, K=32/V=16): the score matrix, a dot's result, feeds the next
        # dot. tf32 products were right on those shapes and are as exact on the inputs (bf16 and
        # fp16 values are tf32 values); fp32 inputs keep IEEE products.
        super().__init__(q, v, BT, tf32=True)
        # products of two loaded inputs: in their own dtype, exact
        self.input_dtype = product_settings(q.dtype)["OPERAND_DTYPE"]
        # the stored states: bf16 for bf16 inputs, as the same-dtype reference rounds them for
        # its products; float32 for fp16 inputs, whose range a state can outgrow. The gate's
        # gradient takes states element-wise, so with a gate the backward keeps them in float32.
        self.state_dtype = store_dtype(q.dtype) if q.dtype == torch.bfloat16 else torch.float32

    def operands(self, states):
        """INPUT_DTYPE and STATE_DTYPE of the kernels reading `states` (or dh) in their dtype."""
        bf16 = states.dtype == torch.bfloat16
        return dict(INPUT_DTYPE=self.input_dtype,
                    STATE_DTYPE=tl.bfloat16 if bf16 else self.dots["OPERAND_DTYPE"])

    def blocks(self, kernel):
        """(number of K-blocks, of V-blocks, launch keywords) of `kernel` in TUNING."""
        BK, BV, launch = tuned_blocks(self.K, self.V, TUNING[kernel])
        return triton.cdiv(self.K, BK), triton.cdiv(self.V, BV), dict(BK=BK, BV=BV, **launch, **self.dots)


def _states(L, k, v, g, initial_state, state_dtype=torch.float32, chunk_offsets=None):
    """(states [B, H, NT, K, V] in state_dtype, entering each chunk; final state float32)."""
    return chunk_fwd_h(k, v, g, initial_state, BT, **L.state_dots, state_dtype=state_dtype,
                       tuning=TUNING["fwd_h"], chunk_offsets=chunk_offsets)


def chunk_simple_gla_fwd(q, k, v, g, scale, initial_state, chunk_offsets=None):
    """(o in v's dtype, final state [B, H, K, V] float32). chunk_offsets: None, or those of a
    packed batch's sequences on its aligned row (ops/common/varlen.py; states [N, H, K, V])."""
    L = _Launch(q, v)
    states, final = _states(L, k, v, g, initial_state, L.state_dtype, chunk_offsets)
    o = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=v.device)
    _, NV, kw = L.blocks("fwd_o")
    launch(_fwd_o_kernel, flat_grid(NV, L.NT, L.B * L.H),
        q, k, v, g, states, o, scale, L.T, L.NT, L.H, L.K, L.V, BT=BT, USE_G=g is not None,
        **L.operands(states), **kw)
    return o.to(v.dtype), final


def chunk_simple_gla_bwd(q, k, v, g, scale, initial_state, do, dht, chunk_offsets=None):
    """(dq, dk, dv, dg or None, dh0 or None); dht may be None (no gradient from the final state).
    chunk_offsets: as for `chunk_simple_gla_fwd`."""
    L = _Launch(q, v)
    state_dtype = L.state_dtype if g is None else torch.float32
    states, _ = _states(L, k, v, g, initial_state, state_dtype, chunk_offsets)
    dh, dh0 = chunk_bwd_dh(q, g, do, dht, scale, BT, q_gate_exclusive=False,
                           need_dh0=initial_state is not None, **L.state_dots,
                           state_dtype=torch.float32, tuning=TUNING["bwd_dh"],
                           chunk_offsets=chunk_offsets)
    dv = torch.empty(v.shape, dtype=store_dtype(v.dtype), device=v.device)
    _, NV, kw = L.blocks("bwd_dv")
    launch(_bwd_dv_kernel, flat_grid(NV, L.NT, L.B * L.H),
        q, k, g, do, dh, dv, scale, L.T, L.NT, L.H, L.K, L.V, BT=BT, USE_G=g is not None,
        **L.operands(dh), **kw)
    dq, dk = (torch.empty(x.shape, dtype=store_dtype(x.dtype), device=x.device) for x in (q, k))
    NK, _, kw = L.blocks("bwd_dqkg")
    dg_part = (torch.empty(NK, L.B, L.T, L.H, dtype=torch.float32, device=q.device)
               if g is not None else None)
    launch(_bwd_dqkg_kernel, flat_grid(NK, L.NT, L.B * L.H),
        q, k, v, g, do, states, dh, dq, dk, dg_part, scale, L.T, L.NT, L.B, L.H, L.K, L.V,
        BT=BT, USE_G=g is not None, **L.operands(states), **kw)
    dg = None if g is None else sum_parts(dg_part, g.dtype)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg, dh0


class ChunkSimpleGLAFunction(torch.autograd.Function):
    """Autograd wrapper: saves only the inputs; backward recomputes the states. g may be None
    (its gradient is then None: the gradient tuple keeps its length)."""

    @staticmethod
    @compiles_ahead
    def forward(ctx, q, k, v, g, scale, initial_state, output_final_state, chunk_offsets=None):
        o, final_state = chunk_simple_gla_fwd(q, k, v, g, scale, initial_state, chunk_offsets)
        final_state = final_state if output_final_state else None
        save_context(ctx, scale, output_final_state, q, k, v, g, initial_state,
                     chunk_offsets=chunk_offsets)
        ctx.set_materialize_grads(False)
        return o, final_state

    @staticmethod
    @compiles_ahead
    def backward(ctx, do, dht):
        q, k, v, g, initial_state = ctx.saved_tensors
        do, dht = upstream(ctx, v, do, dht)
        dq, dk, dv, dg, dh0 = chunk_simple_gla_bwd(q, k, v, g, ctx.scale, initial_state, do, dht,
                                                   ctx.chunk_offsets)
        return input_grads(ctx, (dq, dk, dv, dg), dh0, initial_state)


def decay_gate(op, q, k, v, g, g_gamma, initial_state, cu_seqlens=None):
    """(the gate [B, T, H] a simple-GLA call runs with, the `check_inputs` sizes), its arguments
    checked first: g, or the constant per-head log decay g_gamma [H] as that gate of every step
    (None for neither).

    g_gamma takes no gradient (its gradient is None, as upstream returns none): it enters
    detached, so the kernels skip the gate gradient for it.
    """
    sizes = check_inputs(op, dict(q=q, k=k, v=v, g=g, g_gamma=g_gamma), SIMPLE_GLA_LAYOUTS,
                         optional=("g", "g_gamma"), initial_state=initial_state,
                         cu_seqlens=cu_seqlens)
    if g_gamma is None:
        return g, sizes
    if g is not None:
        raise ValueError(f"{op}: pass g or g_gamma, not both.")
    return g_gamma.detach().expand(q.shape[:3]).contiguous(), sizes


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                     output_final_state=False, cu_seqlens=None):
    """Chunked simple GLA: returns (o [B, T, H, V] in the inputs' dtype, final state [B, H, K, V]
    float32 or None).

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] (one log decay <= 0 per head and step) or
    None (no decay: linear attention; its gradient is then None); one dtype (fp32, fp16 or bf16),
    but g may be float32 beside 16-bit q, k, v. g_gamma: [H], a constant log decay per head in
    place of g (not both); its gradient is None (`decay_gate`). scale defaults to K ** -0.5;
    initial_state: [B, H, K, V] float32 or None. Differentiable in q, k, v, g and initial_state.
    cu_seqlens: None, or int32 / int64 [N + 1], the cumulative starts of N sequences packed
    along T (B = 1), each run on its own: initial and final state [N, H, K, V].
    """
    g, sizes = decay_gate("chunk_simple_gla", q, k, v, g, g_gamma, initial_state, cu_seqlens)
    return apply_checked(ChunkSimpleGLAFunction, "chunk_simple_gla", dict(q=q, k=k, v=v, g=g),
                         SIMPLE_GLA_LAYOUTS, scale, initial_state, output_final_state,
                         optional=("g",), chunk_size=BT, sizes=sizes)
