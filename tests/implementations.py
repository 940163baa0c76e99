"""Implementations with the public rwkv6 signature, for testing the harness itself.

`baseline_like` is correct (the chunked reference computed as a production kernel in the inputs'
dtype would); the others each carry one planted bug that the harness must name.
"""
import torch

from references.rwkv6 import rwkv6_chunked


def baseline_like(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False):
    return rwkv6_chunked(r, k, v, w, u, scale=scale, initial_state=initial_state,
                         output_final_state=output_final_state, chunk_size=32, operand_dtype=r.dtype)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("planted failure in backward")


def gate_grad_scaled(r, k, v, w, u, **kw):
    """dw is 0.9 of the truth; everything else is right."""
    return baseline_like(r, k, v, _ScaleGrad.apply(w, 0.9), u, **kw)


def raises_in_backward(r, k, v, w, u, **kw):
    return baseline_like(r, k, _RaiseInBackward.apply(v), w, u, **kw)


def raises_in_forward(r, k, v, w, u, **kw):
    raise RuntimeError("planted failure in forward")


def nan_from_t10(r, k, v, w, u, **kw):
    o, ht = baseline_like(r, k, v, w, u, **kw)
    mask = torch.zeros_like(o, dtype=torch.bool)
    mask[:, 10:] = True
    return o.masked_fill(mask, float("nan")), ht


def drops_initial_state_grad(r, k, v, w, u, initial_state=None, **kw):
    h0 = None if initial_state is None else initial_state.detach()
    return baseline_like(r, k, v, w, u, initial_state=h0, **kw)


def no_final_state(r, k, v, w, u, **kw):
    o, _ = baseline_like(r, k, v, w, u, **kw)
    return o, None


def through_bf16(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False):
    """An fp32 kernel that secretly rounds its inputs to bf16."""
    low = [x.to(torch.bfloat16).to(x.dtype) for x in (r, k, v, w, u)]
    return baseline_like(*low, scale=scale, initial_state=initial_state,
                         output_final_state=output_final_state)


def state_in_bf16(r, k, v, w, u, **kw):
    """Returns the final state rounded to bf16 instead of float32."""
    o, ht = baseline_like(r, k, v, w, u, **kw)
    return o, (None if ht is None else ht.to(torch.bfloat16))


def _to_tf32(x):
    """Keep 10 mantissa bits, as a tensor-float-32 matrix unit reads an fp32 operand."""
    if x.dtype != torch.float32:
        return x
    return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)


def through_tf32(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False):
    """An fp32 kernel whose products run in tf32 (Triton's default for an fp32 tl.dot)."""
    low = [_to_tf32(x) for x in (r, k, v)]
    return baseline_like(*low, w, u, scale=scale, initial_state=initial_state,
                         output_final_state=output_final_state)
