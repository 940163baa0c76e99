"""Normalised linear attention (normalize=True): the output divided by the running key sum.

Per (batch, head), with z_t = z0 + sum_{s <= t} k_s over the call's tokens (over each sequence's
own tokens, from its own z0, in a packed batch):
    o_t = (scale q_t S_t) / (scale q_t . z_t + 1e-10)
The numerator is the unnormalised op (any of the three kernels); the state becomes the pair
(S [B, H, K, V], z [B, 1, H, K]), both float32, as initial and as final state. The
denominator's gradient reaches q, k and z0: with d_t = scale q_t . z_t + 1e-10 and
e_t = -(do_t . o_t) / d_t (o the normalised output),
    dq_t += e_t scale z_t,   dk_s = sum_{t >= s} e_t scale q_t (+ dz at the last token),
    dz0 = sum_t e_t scale q_t (+ dz),  d(numerator)_t = do_t / d_t.
A cumulative sum and a row dot: memory bound, in torch ops (float32), after the kernels.
"""
from __future__ import annotations

import torch

from fla_kernels.ops.common.autograd import needed
from fla_kernels.utils import check_inputs

# the layouts of the pair a normalised call takes and returns as its state (`check_inputs`)
NORMALIZED_STATES = dict(h="BHKV", z="B1HK")


def running_sums(x: torch.Tensor, bounds=None, reverse=False) -> torch.Tensor:
    """The running sum of x [B, T, ...] over time (from the end with `reverse`), restarting at
    each packed sequence's start (`bounds`: cu_seqlens as a list, None for whole rows)."""
    def run(y):
        return y.flip(1).cumsum(1).flip(1) if reverse else y.cumsum(1)
    if bounds is None:
        return run(x)
    return torch.cat([run(x[:, a:b]) for a, b in zip(bounds, bounds[1:])], dim=1)


def per_token(z0: torch.Tensor, bounds) -> torch.Tensor:
    """z0 [N, 1, H, K] of each packed sequence, repeated over its tokens: [1, T, H, K]; z0 itself
    for whole rows."""
    if bounds is None:
        return z0
    lengths = torch.tensor([b - a for a, b in zip(bounds, bounds[1:])], device=z0.device)
    return z0.squeeze(1).repeat_interleave(lengths, dim=0).unsqueeze(0)


def _key_sums(k, z0, bounds):
    """z [B, T, H, K] float32: z0 (or 0) plus the running sum of k over each sequence."""
    z = running_sums(k.float(), bounds)
    return z if z0 is None else z + per_token(z0.float(), bounds)


def _last_tokens(x, bounds):
    """x [B, T, ...] at each row's (or packed sequence's) last token: [B or N, 1, ...]."""
    if bounds is None:
        return x[:, -1:]
    return x[0, [b - 1 for b in bounds[1:]]].unsqueeze(1)


class NormalizeFunction(torch.autograd.Function):
    """(o / d, z at the last token [B, 1, H, K] float32) from the unnormalised o; see the module
    docstring. Saves q, k, z0, o and d [B, T, H, 1]; recomputes z in the backward."""

    @staticmethod
    def forward(ctx, o, q, k, z0, scale, bounds):
        z = _key_sums(k, z0, bounds)
        d = scale * (q.float() * z).sum(-1, keepdim=True) + 1e-10
        ctx.save_for_backward(o, q, k, z0, d)
        ctx.scale, ctx.bounds = scale, bounds
        ctx.set_materialize_grads(False)
        return (o.float() / d).to(o.dtype), _last_tokens(z, bounds).contiguous()

    @staticmethod
    def backward(ctx, do, dzt):
        o, q, k, z0, d = ctx.saved_tensors
        scale, bounds = ctx.scale, ctx.bounds
        do = torch.zeros_like(o, dtype=torch.float32) if do is None else do.float()
        e = -(do * o.float()).sum(-1, keepdim=True) / (d * d)
        dz = e * scale * q.float()
        if dzt is not None and bounds is None:
            dz[:, -1:] += dzt.float()
        elif dzt is not None:
            dz[0, [b - 1 for b in bounds[1:]]] += dzt.float().squeeze(1)
        dk = running_sums(dz, bounds, reverse=True)
        dq = e * scale * _key_sums(k, z0, bounds)
        dz0 = None
        if z0 is not None:
            first = dk[:, :1] if bounds is None else dk[0, bounds[:-1]].unsqueeze(1)
            dz0 = first.to(z0.dtype)
        return needed(ctx, (do / d).to(o.dtype), dq.to(q.dtype), dk.to(k.dtype), dz0, None, None)


def normalized(fn, op, q, k, v, scale, initial_state, output_final_state, cu_seqlens=None):
    """The body of a public op called with normalize=True: fn, the op's unnormalised public
    function, then `NormalizeFunction`. initial_state: None, the pair (S, z) or S alone (z0 = 0),
    per sequence of a packed batch (`cu_seqlens`); returns (o, (S, z) float32 or None)."""
    pair = isinstance(initial_state, (tuple, list))
    K = check_inputs(op, dict(q=q, k=k, v=v), dict(q="BTHK", k="BTHK", v="BTHV"),
                     initial_state=initial_state,
                     states=NORMALIZED_STATES if pair else NORMALIZED_STATES["h"])["K"]
    scale = K ** -0.5 if scale is None else float(scale)
    h0, z0 = initial_state if pair else (initial_state, None)
    o, ht = fn(q, k, v, scale=scale, initial_state=h0, output_final_state=output_final_state)
    bounds = None if cu_seqlens is None else cu_seqlens.tolist()
    o, zt = NormalizeFunction.apply(o, q, k, z0, scale, bounds)
    return o, ((ht, zt) if output_final_state else None)
