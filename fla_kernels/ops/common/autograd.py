"""What the ops' autograd Functions share: the context a backward reads, the upstream gradients
as the backward kernels take them, and the gradients autograd asked for."""
from __future__ import annotations

import torch

from fla_kernels.ops.common.varlen import Packing, apply_packed
from fla_kernels.utils import check_inputs


def save_context(ctx, scale: float, output_final_state: bool, *tensors, chunk_offsets=None,
                 initial_state=None):
    """Save `tensors` for the backward with the scale, whether the forward returned a final
    state (its gradient is used only then), the chunk offsets of a packed batch's sequences
    (None unless packed, ops/common/varlen.py) and, where the caller passes it, the initial
    state's dtype (`h0_dtype`, that of its gradient; None without one)."""
    ctx.save_for_backward(*tensors)
    ctx.scale = scale
    ctx.output_final_state = output_final_state
    ctx.chunk_offsets = chunk_offsets
    ctx.h0_dtype = None if initial_state is None else initial_state.dtype


def upstream(ctx, v: torch.Tensor, do, dht):
    """(do, dht) for the backward kernels: do contiguous, zeros where autograd passed None; dht
    float32 and contiguous, None unless the forward returned a final state."""
    do = torch.zeros_like(v) if do is None else do.contiguous()
    dht = dht.to(torch.float32).contiguous() if (dht is not None and ctx.output_final_state) else None
    return do, dht


def needed(ctx, *grads):
    """grads, one per input of the Function, with None where autograd needs no gradient."""
    return tuple(x if need else None for x, need in zip(grads, ctx.needs_input_grad))


def input_grads(ctx, grads, dh0, initial_state):
    """What the backward of a Function called as (*tensors, scale, initial_state,
    output_final_state[, chunk_offsets]) returns (`apply_checked`): the tensors' gradients, dh0
    in initial_state's dtype, None for the others and where autograd needs none."""
    return needed(ctx, *grads, None, cast(dh0, getattr(initial_state, "dtype", None)), None, None)


def cast(x, dtype):
    """x in dtype, or None for None."""
    return None if x is None else x.to(dtype)


def apply_checked(function, op: str, tensors: dict, layouts: dict, scale, initial_state,
                  output_final_state, optional=(), cu_seqlens=None, chunk_size=None, sizes=None):
    """The body of a public op with one state: its arguments checked (`check_inputs`, ValueError
    before any launch), scale K ** -0.5 by default, the tensors and initial_state contiguous,
    then function.apply(*tensors, scale, initial_state, output_final_state), or with cu_seqlens
    the same with the tensors on the packed batch's aligned row of chunks of chunk_size and its
    sequences' chunk offsets last (`apply_packed`). sizes: the call's `check_inputs` sizes where
    the caller has checked its arguments already (they then hold its cu_seqlens)."""
    if sizes is None:
        sizes = check_inputs(op, tensors, layouts, optional=optional, initial_state=initial_state,
                             cu_seqlens=cu_seqlens)
    scale = sizes["K"] ** -0.5 if scale is None else float(scale)
    args = [None if x is None else x.contiguous() for x in tensors.values()]
    h0 = None if initial_state is None else initial_state.contiguous()
    packing = Packing.of(sizes, chunk_size, args[0].device)
    return apply_packed(function, packing, args, [layouts[name].startswith("BT") for name in tensors],
                        scale, h0, bool(output_final_state))
