"""Gated slot attention's ungated ("vanilla") form, g = None: the slot writes s set their own decay.

Per (batch, head, slot), with z_t = log sum_{u <= t} exp(s_u) over the call's tokens:
    s'_t = exp(s_t - z_t)         (the normalised write)
    g_t  = z_{t-1} - z_t          (the log forget gate, 0 at the first token)
so hv_t = sum_{u <= t} exp(s_u - z_t) v_u, the softmax over time of the writes. The gated kernels
then run on (s', g). g_t is taken as -softplus(s_t - z_{t-1}), the same number without the
cancellation of two large sums. Torch ops (a cumulative logsumexp and elementwise terms, memory
bound) in float32, differentiated by autograd: the gradients of s' and g flow back to s.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def additive_gate(s: torch.Tensor, cu_seqlens=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(s' in s's dtype, g float32), both [B, T, H, M], from the slot writes s [B, T, H, M].

    cu_seqlens: None, or the sequence starts (host ints) of a packed batch (B = 1), each
    sequence's gate its own (z restarting at its first token): one call per sequence."""
    if cu_seqlens is not None:
        parts = [additive_gate(s[:, a:b]) for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])]
        return tuple(torch.cat(x, dim=1) for x in zip(*parts))
    x = s.float()
    z = torch.logcumsumexp(x, dim=1)
    g = torch.cat([torch.zeros_like(x[:, :1]), -F.softplus(x[:, 1:] - z[:, :-1])], dim=1)
    return torch.exp(x - z).to(s.dtype), g
