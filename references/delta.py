"""The delta-rule family's references: one recurrent loop (the definition) and one chunked form
(the WY representation) for delta_rule, gated_delta_rule and kda, which differ only in the decay.

Per (batch, head), with state S [K, V], key row k_t, beta_t and decay D_t:
    u_t = beta_t (v_t - k_t D_t S_{t-1})          (the corrected value)
    S_t = D_t S_{t-1} + k_t^T u_t = (I - beta_t k_t^T k_t) D_t S_{t-1} + beta_t k_t^T v_t
    o_t = scale q_t S_t
D_t is 1 (delta_rule, g None), exp(g_t) with g [B, T, H] (gated_delta_rule) or diag(exp(g_t))
with g [B, T, H, K] (kda): the decay acts before the delta update, as upstream fla's does (for
a scalar decay the order is immaterial). With use_qk_l2norm_in_kernel, q and k are first divided
by sqrt(sum of squares + 1e-6) over K, as upstream's kernels do.

gated_delta_rule and kda also take what upstream's calls compute inside (`call_gate_and_beta`):
the log decay from a raw gate and the layer's parameters (use_gate_in_kernel), beta from its
logit (use_beta_sigmoid_in_kernel), and beta in (0, 2) (allow_neg_eigval: eigenvalues of the
update down to -1).
"""
from __future__ import annotations

import torch

from references.common import (chunk_inputs, chunks_to_time, default_scale, gated_scores, map_chunk_groups,
                               recurrent_loop, start_state, work_dtype_of)

L2NORM_EPS = 1e-6


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + 1e-6) over the last dimension: upstream's in-kernel q, k normalisation."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def call_gate_and_beta(g, beta, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                       use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False):
    """(g, beta) as the recurrence takes them, from what the call was given, in the working dtype:
    g = -exp(A_log) * softplus(g + dt_bias) per head (A_log [H]; dt_bias [H], or [H * K] for a
    per-channel g) with use_gate_in_kernel, beta = sigmoid(beta) with use_beta_sigmoid_in_kernel,
    twice that with allow_neg_eigval too (which alone is refused, as upstream refuses it)."""
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")
    if use_gate_in_kernel:
        work = work_dtype_of(g.dtype)
        bias = 0 if dt_bias is None else dt_bias.to(work).view(g.shape[2:])
        A = torch.exp(A_log.to(work)).view(-1, *([1] * (g.dim() - 3)))
        g = -A * torch.nn.functional.softplus(g.to(work) + bias)
    if use_beta_sigmoid_in_kernel:
        beta = torch.sigmoid(beta.to(work_dtype_of(beta.dtype))) * (2 if allow_neg_eigval else 1)
    return g, beta


def _decay(g_t, state):
    """exp(g_t) applied to a [B, H, K, V] state: a scalar per head ([B, H]) or per key channel ([B, H, K])."""
    if g_t is None:
        return state
    return state * (torch.exp(g_t)[..., None, None] if g_t.dim() == 2 else torch.exp(g_t)[..., None])


def delta_recurrent(q, k, v, beta, g, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel):
    """Token-by-token loop in the inputs' dtype; autograd through it is linear in T."""
    B, T, H, K = q.shape
    scale = default_scale(K, scale)
    if use_qk_l2norm_in_kernel:
        q, k = l2_normalise(q), l2_normalise(k)

    def step(state, q_t, k_t, v_t, b_t, g_t):
        state = _decay(g_t, state)
        u_t = b_t[..., None] * (v_t - torch.einsum("bhk,bhkv->bhv", k_t, state))
        state = state + k_t[..., :, None] * u_t[..., None, :]
        return state, scale * torch.einsum("bhk,bhkv->bhv", q_t, state)

    state = start_state(initial_state, q, (B, H, K, v.shape[-1]))
    o, state = recurrent_loop(step, state, q, k, v, beta.to(q.dtype), None if g is None else g.to(q.dtype))
    return o, (state if output_final_state else None)


def _scores(a, b, G, channel: bool, rnd, diagonal: int):
    """[B, H, N, C, C]: sum_d a_id b_jd exp(G_id - G_jd) for j <= i + diagonal, else 0. G [..., C, K]
    per channel, or [..., C, 1] one gate per row (then the product of rounded operands times the
    decay); only differences at or below the diagonal are exponentiated."""
    if channel:
        B, H, N, C, K = a.shape
        return map_chunk_groups(lambda a, b, G: gated_scores(a, b, G, G, diagonal), a, b, G,
                                elements_per_chunk=B * H * C * C * K)
    C = a.shape[-2]
    lower = torch.ones(C, C, dtype=torch.bool, device=a.device).tril(diagonal)
    diff = (G[..., :, None, 0] - G[..., None, :, 0]).masked_fill(~lower, float("-inf"))
    return (rnd(a) @ rnd(b).transpose(-1, -2)) * torch.exp(diff)


def delta_chunked(q, k, v, beta, g, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                  chunk_size, operand_dtype):
    """The WY form: the same numbers as the loop, far faster for long T.

    Inside a chunk with entering state S and G the inclusive chunk-local cumulative log gate,
    the corrected values U solve (I + A) U = beta V - beta (K exp(G)) S with A strictly lower,
    A_ij = beta_i (k_i . k_j exp(G_i - G_j)) for j < i; with Tinv = (I + A)^{-1} (a unit lower
    triangular solve), W = Tinv (beta K exp(G)) and U = Tinv (beta V) - W S. Then
        o_i = scale (q_i exp(G_i) S + sum_{j <= i} (q_i . k_j exp(G_i - G_j)) u_j)
        S' = exp(G_last) S + sum_j (k_j exp(G_last - G_j))^T u_j
    Only differences G_i - G_j with i >= j are exponentiated, so strong decay stays finite.
    `operand_dtype` rounds the operands of every matrix product (`references.common.chunk_inputs`);
    the solve, the gates and the carried state stay in the working dtype.
    """
    T, out_dtype = q.shape[1], q.dtype
    if use_qk_l2norm_in_kernel:
        q, k = (l2_normalise(x.to(work_dtype_of(x.dtype))) for x in (q, k))
    channel = g is not None and g.dim() == 4
    gk = beta.new_zeros(beta.shape + (1,)) if g is None else (g if channel else g[..., None])
    scale, rnd, (q, k, v, gk, b) = chunk_inputs((q, k, v, gk, beta[..., None]), scale, chunk_size,
                                                operand_dtype)
    B, H, N, C, K = q.shape
    G = torch.cumsum(gk, dim=-2)                                      # [B, H, N, C, K or 1]
    A = b * _scores(k, k, G, channel, rnd, -1)                        # strictly lower
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    Tinv = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
    W = rnd(Tinv) @ rnd(b * k * torch.exp(G))
    U0 = rnd(Tinv) @ rnd(b * v)
    P = _scores(q, k, G, channel, rnd, 0)                              # causal, diagonal included
    q_in = q * torch.exp(G)
    G_last = G[..., -1:, :]
    k_out = k * torch.exp(G_last - G)
    decays = torch.exp(G_last).transpose(-1, -2)                      # [B, H, N, K or 1, 1]
    S = start_state(initial_state, q, (B, H, K, v.shape[-1]))
    outs = []
    for W_n, U_n, P_n, q_n, k_n, d_n in zip(*(x.unbind(2) for x in (W, U0, P, q_in, k_out, decays))):
        U_n = U_n - rnd(W_n) @ rnd(S)
        outs.append(scale * (rnd(q_n) @ rnd(S) + rnd(P_n) @ rnd(U_n)))
        S = d_n * S + rnd(k_n).transpose(-1, -2) @ rnd(U_n)
    o = torch.stack(outs, dim=2)
    return chunks_to_time(o, T, out_dtype), (S if output_final_state else None)

