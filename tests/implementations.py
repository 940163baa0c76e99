"""Implementations with the public rwkv6 signature, for testing the harness itself.

`baseline_like` is correct (the chunked reference computed as a production kernel in the inputs'
dtype would); the others each carry one planted bug that the harness must name.
"""
import itertools
import math

import torch

from references.rwkv6 import rwkv6_chunked


def baseline_like(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False):
    return rwkv6_chunked(r, k, v, w, u, scale=scale, initial_state=initial_state,
                         output_final_state=output_final_state, chunk_size=32, operand_dtype=r.dtype)


class _OnGradient(torch.autograd.Function):
    """Identity whose backward hands on `transform(gradient)`: a planted gradient bug."""
    @staticmethod
    def forward(ctx, x, transform):
        ctx.transform = transform
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.transform(grad), None


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("planted failure in backward")


class _NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("this function has no backward; use the chunked one for training")


def gate_grad_scaled(r, k, v, w, u, **kw):
    """dw is 0.9 of the truth; everything else is right."""
    return baseline_like(r, k, v, _OnGradient.apply(w, lambda grad: grad * 0.9), u, **kw)


def raises_in_backward(r, k, v, w, u, **kw):
    return baseline_like(r, k, _RaiseInBackward.apply(v), w, u, **kw)


def forward_only(r, k, v, w, u, **kw):
    """A forward-only implementation (inference kernels): its backward raises NotImplementedError."""
    return baseline_like(r, k, _NoBackward.apply(v), w, u, **kw)


def outside_autograd(r, k, v, w, u, **kw):
    """A forward-only implementation that never meets autograd: its outputs carry no gradient."""
    with torch.no_grad():
        return baseline_like(r, k, v, w, u, **kw)


def last_token_unwritten(r, k, v, w, u, **kw):
    """Its output buffer comes from torch.empty_like and the last token is never written."""
    o, ht = baseline_like(r, k, v, w, u, **kw)
    out = torch.empty_like(o)
    out[:, :-1] = o[:, :-1]
    return out, ht


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


def writes_into_input(r, k, v, w, u, **kw):
    """Scales its input k in place after the forward (a scratch buffer reused by mistake)."""
    out = baseline_like(r, k, v, w, u, **kw)
    k.data.mul_(2)
    return out


_calls = itertools.count()


def nondeterministic(r, k, v, w, u, **kw):
    """Every other call moves one element of o by one ulp (an atomic-add order that varies)."""
    o, ht = baseline_like(r, k, v, w, u, **kw)
    if next(_calls) % 2:
        bump = torch.zeros_like(o)
        first = o[0, 0, 0, 0].detach()
        bump[0, 0, 0, 0] = torch.nextafter(first, torch.full_like(first, math.inf)) - first
        o = o + bump
    return o, ht


def ignores_initial_state(r, k, v, w, u, initial_state=None, **kw):
    """Starts from zero whatever initial state it is given."""
    return baseline_like(r, k, v, w, u, **kw)


def inference_ignores_initial_state(r, k, v, w, u, initial_state=None, **kw):
    """Right wherever autograd records it; its inference path (grad mode off, as a model's
    generation runs it) starts from zero whatever initial state it is given."""
    if not torch.is_grad_enabled():
        initial_state = None
    return baseline_like(r, k, v, w, u, initial_state=initial_state, **kw)


def decay_off_by_one_at_chunk_starts(r, k, v, w, u, **kw):
    """The first token of every 32-token chunk decays with the previous token's w."""
    shifted = w.clone()
    shifted[:, 32::32] = w[:, 31:-1:32]
    return baseline_like(r, k, v, shifted, u, **kw)


def overflows_at_long_T(r, k, v, w, u, **kw):
    """Forms exp(-cumsum(w)) over the whole sequence, as an unguarded kernel would: it overflows
    to inf (and o to NaN) once the summed decay passes ~88, that is only for long T."""
    o, ht = baseline_like(r, k, v, w, u, **kw)
    growth = torch.exp(-w.float().cumsum(1)).amax(-1, keepdim=True)   # [B, T, H, 1]
    return o * (1 + 0 * growth).to(o.dtype), ht


class _NeedsStateGradient(torch.autograd.Function):
    """Identity on (o, final state) whose backward assumes the state's gradient is always given."""

    @staticmethod
    def forward(ctx, o, ht):
        ctx.set_materialize_grads(False)
        return o.view_as(o), ht.view_as(ht)

    @staticmethod
    def backward(ctx, do, dht):
        return do, dht.clone()


def needs_final_state_gradient(r, k, v, w, u, **kw):
    """Right numbers, but its backward fails when the final state is returned and not used."""
    o, ht = baseline_like(r, k, v, w, u, **kw)
    return (o, None) if ht is None else _NeedsStateGradient.apply(o, ht)


def _keep_bits(grad, bits=5):
    """`grad` with `bits` mantissa bits, rounded to nearest."""
    mantissa, exponent = torch.frexp(grad.float())
    scale = 2.0 ** bits
    return torch.ldexp(torch.round(mantissa * scale) / scale, exponent).to(grad.dtype)


def chunk_with_coarse_gate_grad(r, k, v, w, u, **kw):
    """Our chunk_rwkv6 with dw kept to 5 mantissa bits, as a kernel change that stores the gate
    gradient through a narrow intermediate would: dw's error grows several-fold, the rest is ours."""
    from fla_kernels.ops.rwkv6 import chunk_rwkv6
    return chunk_rwkv6(r, k, v, _OnGradient.apply(w, _keep_bits), u, **kw)


class _RoundedUp(torch.autograd.Function):
    """Hands its input on in float32 and rounds the float32 gradient back to the input's dtype
    towards +inf instead of to nearest: each element is off by at most one rounding, on average
    half of one, always in the same direction."""

    @staticmethod
    def forward(ctx, x):
        ctx.dtype = x.dtype
        return x.float()

    @staticmethod
    def backward(ctx, grad):
        nearest = grad.to(ctx.dtype)
        below = nearest.float() < grad
        return torch.where(below, torch.nextafter(nearest, torch.full_like(nearest, math.inf)), nearest)


def gate_grad_rounded_up(r, k, v, w, u, **kw):
    """dw rounded towards +inf where a kernel should round to nearest (a store that truncates the
    wrong way): every element within its bound, their sums not."""
    return baseline_like(r, k, v, _RoundedUp.apply(w), u, **kw)


def o_one_step_short(r, k, v, w, u, **kw):
    """Returns o without its last step; the final state is right."""
    o, ht = baseline_like(r, k, v, w, u, **kw)
    return o[:, :-1], ht


def returns_o_only(r, k, v, w, u, **kw):
    """Returns o alone where the op returns (o, final state)."""
    return baseline_like(r, k, v, w, u, **kw)[0]


def slow(r, k, v, w, u, **kw):
    """baseline_like, a second slower per call (time for a test to interrupt a sweep)."""
    import time
    time.sleep(1.0)
    return baseline_like(r, k, v, w, u, **kw)


# Packed variable-length batches (cu_seqlens, B = 1, states [N, H, K, V]) ----------------------------

def _sequences(cu_seqlens):
    bounds = cu_seqlens.tolist()
    return list(zip(bounds, bounds[1:]))


def _packed(r, k, v, w, u, cu_seqlens, initial_state, output_final_state, start_of, calls=baseline_like,
            **kw):
    """Each sequence run by `calls` from start_of(n, initial_state, previous final state)."""
    outs, finals, previous = [], [], None
    for n, (t0, t1) in enumerate(_sequences(cu_seqlens)):
        h0 = start_of(n, initial_state, previous)
        o, ht = calls(r[:, t0:t1], k[:, t0:t1], v[:, t0:t1], w[:, t0:t1], u, initial_state=h0,
                      output_final_state=True, **kw)
        outs.append(o)
        finals.append(ht)
        previous = ht
    return torch.cat(outs, 1), torch.cat(finals, 0) if output_final_state else None


def _own_start(n, initial_state, previous):
    return None if initial_state is None else initial_state[n:n + 1]


def packed_like(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Correct: each sequence from its own initial state."""
    if cu_seqlens is None:
        return baseline_like(r, k, v, w, u, scale=scale, initial_state=initial_state,
                             output_final_state=output_final_state)
    return _packed(r, k, v, w, u, cu_seqlens, initial_state, output_final_state, _own_start, scale=scale)


def packed_state_crosses_boundaries(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                                    cu_seqlens=None):
    """Every sequence after the first starts from the previous one's final state, not its own."""
    def start(n, initial_state, previous):
        return _own_start(n, initial_state, previous) if n == 0 else previous
    return _packed(r, k, v, w, u, cu_seqlens, initial_state, output_final_state, start, scale=scale)


def packed_length_one_zeroed(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                             cu_seqlens=None):
    """A sequence of one token gets o = 0 (a kernel whose loop never runs for it)."""
    o, ht = packed_like(r, k, v, w, u, scale, initial_state, output_final_state, cu_seqlens)
    keep = torch.ones_like(o)
    for t0, t1 in _sequences(cu_seqlens):
        if t1 - t0 == 1:
            keep[:, t0] = 0
    return o * keep, ht


def packed_boundary_one_early(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                              cu_seqlens=None):
    """The end of the longest sequence read one token early (its last token starts the next)."""
    shifted = cu_seqlens.clone()
    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).argmax())
    shifted[longest + 1] -= 1
    return packed_like(r, k, v, w, u, scale, initial_state, output_final_state, shifted)


def packed_not_implemented(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None):
    if cu_seqlens is not None:
        raise NotImplementedError("cu_seqlens is not supported")
    return baseline_like(r, k, v, w, u, scale=scale, initial_state=initial_state,
                         output_final_state=output_final_state)


def packed_path_in_bf16(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                        cu_seqlens=None):
    """Right when called per sequence; its packed path rounds o to bf16."""
    o, ht = packed_like(r, k, v, w, u, scale, initial_state, output_final_state, cu_seqlens)
    return (o.to(torch.bfloat16).to(o.dtype) if cu_seqlens is not None else o), ht


def raises_not_implemented(r, k, v, w, u, **kw):
    raise NotImplementedError("planted: not implemented")


def gate_rounded_to_activations(r, k, v, w, u, **kw):
    """A float32 gate read in the activations' dtype (bf16 beside bf16 r, k, v)."""
    return baseline_like(r, k, v, w.to(r.dtype), u, **kw)


def last_row_last_head_zeroed(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                              cu_seqlens=None):
    """o of the last batch row (or packed token) at the last head is 0: an offset that wrapped."""
    o, ht = packed_like(r, k, v, w, u, scale, initial_state, output_final_state, cu_seqlens)
    keep = torch.ones_like(o)
    keep[-1, -1, -1] = 0
    return o * keep, ht


def anchored_on_the_chunk_end(r, k, v, w, u, **kw):
    """r scaled by a factor drawn from the last token of its 32-token chunk and divided by it
    again, in r's dtype: the algebra cancels and the rounding does not, so o before a token
    depends on later ones by a rounding (as upstream KDA's safe_gate anchor on a later row did)."""
    T = r.shape[1]
    end = torch.clamp((torch.arange(T, device=r.device) // 32 + 1) * 32 - 1, max=T - 1)
    s = torch.exp(k[:, end].mean(-1, keepdim=True)).to(r.dtype)
    return baseline_like((r * s) / s, k, v, w, u, **kw)
