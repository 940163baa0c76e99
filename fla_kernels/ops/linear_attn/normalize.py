"""Normalised linear attention (normalize=True): the output divided by the running key sum.

Per (batch, head), with z_t = z0 + sum_{s <= t} k_s over the call's tokens:
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


def _key_sums(k, z0):
    """z [B, T, H, K] float32: z0 [B, 1, H, K] (or 0) plus the running sum of k over time."""
    z = torch.cumsum(k.float(), dim=1)
    return z if z0 is None else z + z0.float()


class NormalizeFunction(torch.autograd.Function):
    """(o / d, z at the last token [B, 1, H, K] float32) from the unnormalised o; see the module
    docstring. Saves q, k, z0, o and d [B, T, H, 1]; recomputes z in the backward."""

    @staticmethod
    def forward(ctx, o, q, k, z0, scale):
        z = _key_sums(k, z0)
        d = scale * (q.float() * z).sum(-1, keepdim=True) + 1e-10
        ctx.save_for_backward(o, q, k, z0, d)
        ctx.scale = scale
        ctx.set_materialize_grads(False)
        return (o.float() / d).to(o.dtype), z[:, -1:].clone(memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx, do, dzt):
        o, q, k, z0, d = ctx.saved_tensors
        scale = ctx.scale
        do = torch.zeros_like(o, dtype=torch.float32) if do is None else do.float()
        e = -(do * o.float()).sum(-1, keepdim=True) / (d * d)
        dz = e * scale * q.float()
        if dzt is not None:
            dz[:, -1:] += dzt.float()
        dk = dz.flip(1).cumsum(1).flip(1)
        dq = e * scale * _key_sums(k, z0)
        dz0 = None if z0 is None else dk[:, :1].to(z0.dtype)
        return needed(ctx, (do / d).to(o.dtype), dq.to(q.dtype), dk.to(k.dtype), dz0, None)


def normalized(fn, op, q, k, v, scale, initial_state, output_final_state, cu_seqlens=None):
    """The body of a public op called with normalize=True: fn, the op's unnormalised public
    function, then `NormalizeFunction`. initial_state: None, the pair (S, z) or S alone (z0 = 0);
    returns (o, (S, z) float32 or None). cu_seqlens: a packed batch's (B = 1), each sequence
    normalised by its own key sum from its own z0 (`NormalizeFunction` once per sequence)."""
    pair = isinstance(initial_state, (tuple, list))
    sizes = check_inputs(op, dict(q=q, k=k, v=v), dict(q="BTHK", k="BTHK", v="BTHV"),
                         initial_state=initial_state,
                         states=NORMALIZED_STATES if pair else NORMALIZED_STATES["h"],
                         cu_seqlens=cu_seqlens)
    scale = sizes["K"] ** -0.5 if scale is None else float(scale)
    h0, z0 = initial_state if pair else (initial_state, None)
    packed = {} if cu_seqlens is None else dict(cu_seqlens=cu_seqlens)
    o, ht = fn(q, k, v, scale=scale, initial_state=h0, output_final_state=output_final_state, **packed)
    if cu_seqlens is None:
        o, zt = NormalizeFunction.apply(o, q, k, z0, scale)
    else:
        bounds = sizes["cu_seqlens"]
        parts = [NormalizeFunction.apply(o[:, a:b], q[:, a:b], k[:, a:b],
                                         None if z0 is None else z0[n:n + 1], scale)
                 for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
        o, zt = torch.cat([p[0] for p in parts], dim=1), torch.cat([p[1] for p in parts], dim=0)
    return o, ((ht, zt) if output_final_state else None)
