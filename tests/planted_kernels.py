"""Our kernels with one planted bug each, of the kinds an API-surface change brings (a packed
batch, an option, a narrow head), to show that a sweep fails them on the right row and nowhere
else (tests/test_planted_kernels.py). The packed ones run each sequence through our plain kernel
and get the packing wrong around it. The delta-rule ones are a float32 torch loop (or its WY chunked
form) with the bug in its arithmetic (tests/test_delta_rule.py), beside the same code without it."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fla_kernels import chunk_gla, chunk_gsa, chunk_linear_attn, fused_recurrent_gla


def _sequences(cu_seqlens):
    bounds = cu_seqlens.tolist()
    return list(zip(bounds, bounds[1:]))


def _packed_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, carry=False):
    """Each sequence through fused_recurrent_gla from its own initial state, or with `carry`
    from the previous sequence's final state (a state not reset at a boundary)."""
    outs, finals, previous = [], [], None
    for n, (t0, t1) in enumerate(_sequences(cu_seqlens)):
        own = None if initial_state is None else initial_state[n:n + 1]
        start = previous if carry and n else own
        o, ht = fused_recurrent_gla(q[:, t0:t1], k[:, t0:t1], v[:, t0:t1], g[:, t0:t1], scale=scale,
                                    initial_state=start, output_final_state=True)
        outs.append(o)
        finals.append(ht)
        previous = ht
    return torch.cat(outs, 1), torch.cat(finals, 0) if output_final_state else None


def gla_state_not_reset_at_boundaries(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                                      cu_seqlens=None):
    if cu_seqlens is None:
        return fused_recurrent_gla(q, k, v, g, scale=scale, initial_state=initial_state,
                                   output_final_state=output_final_state)
    return _packed_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, carry=True)


def gla_length_one_sequence_skipped(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                                    cu_seqlens=None):
    """A sequence of one token is passed over: its o is 0 and its final state its initial one."""
    if cu_seqlens is None:
        return fused_recurrent_gla(q, k, v, g, scale=scale, initial_state=initial_state,
                                   output_final_state=output_final_state)
    o, ht = _packed_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)
    for n, (t0, t1) in enumerate(_sequences(cu_seqlens)):
        if t1 - t0 == 1:
            o = torch.cat([o[:, :t0], torch.zeros_like(o[:, t0:t1]), o[:, t1:]], 1)
            if ht is not None:
                start = torch.zeros_like(ht[n:n + 1]) if initial_state is None else initial_state[n:n + 1]
                ht = torch.cat([ht[:n], start, ht[n + 1:]], 0)
    return o, ht


def gla_narrow_head_last_column_dropped(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                                        **options):
    """A head narrower than the 16 columns of a `tl.dot` loses its last key column (a mask that
    covers the block, not the head)."""
    if q.shape[-1] < 16:
        keep = torch.ones(q.shape[-1], dtype=q.dtype, device=q.device)
        keep[-1] = 0
        k = k * keep
    return chunk_gla(q, k, v, g, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, **options)


def linear_attn_normaliser_without_initial_key_sum(q, k, v, scale=None, initial_state=None,
                                                   output_final_state=False, normalize=False, **options):
    """normalize=True drops the key sum z0 the initial state carries (right without one)."""
    if normalize and isinstance(initial_state, tuple):
        S, z0 = initial_state
        initial_state = (S, torch.zeros_like(z0))
    return chunk_linear_attn(q, k, v, scale=scale, initial_state=initial_state,
                             output_final_state=output_final_state, normalize=normalize, **options)


def gsa_missing_gate_as_no_decay(q, k, v, s, g=None, scale=None, initial_state=None, output_final_state=False,
                                 **options):
    """g=None read as a gate of zeros (no decay, s as given) instead of the ungated form."""
    if g is None:
        g = torch.zeros_like(s)
    return chunk_gsa(q, k, v, s, g, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, **options)


def _delta_loop(q, k, v, beta, g, scale, initial_state, output_final_state, decay_first=True,
                full_beta_grad=True):
    """The delta-rule family token by token in float32 torch (g None, [B, T, H] or [B, T, H, K]),
    correct unless told: decay_first=False lets the key read the state before its decay;
    full_beta_grad=False leaves the correction k_t H_t out of dbeta (its forward unchanged)."""
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    q, k, v, beta = (x.float() for x in (q, k, v, beta))
    S = torch.zeros(B, H, K, v.shape[-1], device=q.device) if initial_state is None else initial_state.float()
    outs = []
    for t in range(T):
        decayed = S
        if g is not None:
            decay = g[:, t].float().exp()
            decayed = S * (decay[..., None, None] if g.dim() == 3 else decay[..., None])
        read = torch.einsum("bhk,bhkv->bhv", k[:, t], decayed if decay_first else S)
        b = beta[:, t, :, None]
        u = b * v[:, t] - (b if full_beta_grad else b.detach()) * read
        S = decayed + k[:, t, :, :, None] * u[..., None, :]
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(outs, 1).to(v.dtype), S if output_final_state else None


def delta_rule_like(q, k, v, beta, scale=None, initial_state=None, output_final_state=False):
    """Correct: the float32 loop the planted delta-rule kernels below break."""
    return _delta_loop(q, k, v, beta, None, scale, initial_state, output_final_state)


def delta_rule_beta_grad_without_correction(q, k, v, beta, scale=None, initial_state=None,
                                            output_final_state=False):
    """dbeta = du . v instead of du . (v - k_t S_{t-1}): the forward is right."""
    return _delta_loop(q, k, v, beta, None, scale, initial_state, output_final_state, full_beta_grad=False)


def kda_like(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """Correct: the float32 loop the planted kda kernel below breaks."""
    return _delta_loop(q, k, v, beta, g, scale, initial_state, output_final_state)


def kda_key_reads_undecayed_state(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """The delta update's key reads S_{t-1} instead of the decayed diag(exp(g_t)) S_{t-1}."""
    return _delta_loop(q, k, v, beta, g, scale, initial_state, output_final_state, decay_first=False)


def _in_call(g, beta, use_gate_in_kernel=False, A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
             allow_neg_eigval=False, plant=""):
    """(g, beta) the gated delta rule's call computes from what it is given (float32), correct
    unless `plant` names a bug: "neg_eigval_ignored" (beta = sigmoid, not 2 sigmoid),
    "bias_gradient_dropped" (dt_bias detached: no ddt_bias), "A_log_as_A" (no exp)."""
    if use_gate_in_kernel:
        bias = dt_bias.float().detach() if plant == "bias_gradient_dropped" else dt_bias.float()
        A = A_log.float() if plant == "A_log_as_A" else A_log.float().exp()
        g = -A * F.softplus(g.float() + bias)
    if use_beta_sigmoid_in_kernel:
        beta = torch.sigmoid(beta.float()) * (2 if allow_neg_eigval and plant != "neg_eigval_ignored" else 1)
    return g, beta


def _gated_in_call(plant, q, k, v, g, beta, scale, initial_state, output_final_state, options):
    g, beta = _in_call(g, beta, plant=plant, **options)
    return _delta_loop(q, k, v, beta, g, scale, initial_state, output_final_state)


def gated_delta_rule_like(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                          **options):
    """Correct: the float32 loop, taking the call's options (`_in_call`)."""
    return _gated_in_call("", q, k, v, g, beta, scale, initial_state, output_final_state, options)


def gated_delta_rule_neg_eigval_ignored(q, k, v, g, beta, scale=None, initial_state=None,
                                        output_final_state=False, **options):
    """allow_neg_eigval taken but beta left at sigmoid(beta), in (0, 1)."""
    return _gated_in_call("neg_eigval_ignored", q, k, v, g, beta, scale, initial_state, output_final_state,
                          options)


def gated_delta_rule_bias_gradient_dropped(q, k, v, g, beta, scale=None, initial_state=None,
                                           output_final_state=False, **options):
    """The in-call gate right forward, but dt_bias detached: no gradient reaches it."""
    return _gated_in_call("bias_gradient_dropped", q, k, v, g, beta, scale, initial_state,
                          output_final_state, options)


def gated_delta_rule_A_log_as_A(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                                **options):
    """The in-call gate with A_log taken for A (no exp)."""
    return _gated_in_call("A_log_as_A", q, k, v, g, beta, scale, initial_state, output_final_state, options)


def _delta_chunks(q, k, v, beta, scale, initial_state, output_final_state, chunk=8, correct=True,
                  solve_last_row=True):
    """The delta rule in chunks of `chunk` tokens (the WY form) in float32 torch: with A the
    strictly lower diag(beta) K K^T and Ti = (I + A)^{-1}, U = Ti beta V - Ti beta K S, o = scale
    (Q S + tril(Q K^T) U), S' = S + K^T U; correct=False drops - Ti beta K S (U = u alone);
    solve_last_row=False stops the triangular solve one row short (each chunk's last row of Ti
    stays the identity's)."""
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    q, k, v, beta = (x.float().transpose(1, 2) for x in (q, k, v, beta))
    S = torch.zeros(B, H, K, v.shape[-1], device=q.device) if initial_state is None else initial_state.float()
    outs = []
    for c0 in range(0, T, chunk):
        qc, kc, vc, bc = (x[:, :, c0:c0 + chunk] for x in (q, k, v, beta))
        eye = torch.eye(kc.shape[2], device=q.device)
        A = torch.tril(bc[..., None] * (kc @ kc.transpose(-1, -2)), -1)
        Ti = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False)
        if not solve_last_row:
            Ti = torch.cat([Ti[..., :-1, :], eye[-1:].expand_as(Ti[..., -1:, :])], dim=-2)
        U = Ti @ (bc[..., None] * vc)
        if correct:
            U = U - Ti @ (bc[..., None] * kc) @ S
        outs.append(scale * (qc @ S + torch.tril(qc @ kc.transpose(-1, -2)) @ U))
        S = S + kc.transpose(-1, -2) @ U
    return torch.cat(outs, 2).transpose(1, 2).to(v.dtype), S if output_final_state else None


def delta_rule_chunks_like(q, k, v, beta, scale=None, initial_state=None, output_final_state=False):
    """Correct: the float32 WY chunks the planted chunked kernel below breaks."""
    return _delta_chunks(q, k, v, beta, scale, initial_state, output_final_state)


def delta_rule_chunks_without_state_correction(q, k, v, beta, scale=None, initial_state=None,
                                               output_final_state=False):
    """Each chunk's corrected values U = u - w h lose their - w h: the state entering a chunk is
    read by its queries and carried, but its keys' delta correction never sees it."""
    return _delta_chunks(q, k, v, beta, scale, initial_state, output_final_state, correct=False)


def delta_rule_chunks_solving_one_row_short(q, k, v, beta, scale=None, initial_state=None,
                                            output_final_state=False):
    """The triangular solve of each chunk stops one row short: the chunk's last token keeps its
    raw beta v instead of its delta-corrected value."""
    return _delta_chunks(q, k, v, beta, scale, initial_state, output_final_state, solve_last_row=False)
