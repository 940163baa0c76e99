"""Our kernels with one planted bug each, of the kinds an API-surface change brings (a packed
batch, an option, a narrow head), to show that a sweep fails them on the right row and nowhere
else (tests/test_planted_kernels.py). The packed ones run each sequence through our plain kernel
and get the packing wrong around it."""
from __future__ import annotations

import torch

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
