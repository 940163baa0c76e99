"""What DeltaNet, GatedDeltaNet and KimiDeltaAttention share, as the upstream layers have it:
short causal convolutions (SiLU) on the query, key and value projections, their last inputs carried
in the cache beside the state; beta = sigmoid(W_b x) per head (twice that with allow_neg_eigval);
q and k L2-normalised by the kernel (use_qk_l2norm_in_kernel); each head's output RMS-normalised
(and gated, where the layer has an output gate) before o_proj."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fla_kernels.layers.base import RecurrentAttention
from fla_kernels.layers.short_convolution import ShortConvolution


def widened(x: torch.Tensor) -> torch.Tensor:
    """x in float32 at least (float64 stays float64: the layer's float64 golden)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def decay(A_log: torch.Tensor, logits: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """The log decay -exp(A_log) * softplus(logits + dt_bias), float32 at least (Mamba2's)."""
    return -widened(A_log).exp() * F.softplus(widened(logits) + widened(dt_bias))


def decay_parameters(count: int) -> tuple:
    """(A_log, dt_bias) of `count` decays: A uniform in (1, 16), dt log-uniform in (1e-3, 0.1)
    with dt_bias its softplus inverse, as the upstream layers draw them (Kimi's lower end of A:
    Gated DeltaNet's 0 can draw A = 0, whose log is -inf)."""
    A = torch.empty(count).uniform_(1, 16)
    dt = torch.exp(torch.rand(count) * (torch.log(torch.tensor(0.1)) - torch.log(torch.tensor(1e-3)))
                   + torch.log(torch.tensor(1e-3))).clamp(min=1e-4)
    return nn.Parameter(torch.log(A)), nn.Parameter(dt + torch.log(-torch.expm1(-dt)))


class DeltaLayer(RecurrentAttention):
    """Subclasses define `delta_inputs(x, q, k, v, beta)` (the kernel's positional inputs) and,
    if they gate the output, `output_gate(x)` and `GATE_ACTIVATION`."""

    KERNEL_OPTIONS = {"use_qk_l2norm_in_kernel": True}
    GATE_ACTIVATION = staticmethod(F.silu)

    def __init__(self, hidden_size: int, num_heads: int, expand_k: float, expand_v: float, mode: str,
                 layer_idx: int | None, use_short_conv: bool = True, conv_size: int = 4,
                 allow_neg_eigval: bool = False, norm_eps: float = 1e-5):
        """use_short_conv: convolutions on q, k, v (without: SiLU of the projections, nothing
        carried beside the state); allow_neg_eigval: beta in (0, 2)."""
        super().__init__(hidden_size, num_heads, expand_k, expand_v, mode, layer_idx)
        self.use_short_conv, self.allow_neg_eigval, self.norm_eps = use_short_conv, allow_neg_eigval, norm_eps
        if use_short_conv:
            self.q_conv1d = ShortConvolution(self.key_dim, conv_size)
            self.k_conv1d = ShortConvolution(self.key_dim, conv_size)
            self.v_conv1d = ShortConvolution(self.value_dim, conv_size)
        self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.o_norm = nn.Parameter(torch.ones(self.head_v_dim))

    def delta_inputs(self, x, q, k, v, beta) -> tuple:
        raise NotImplementedError

    def state_shapes(self):
        return [(self.num_heads, self.head_k_dim, self.head_v_dim)]

    def _convolutions(self) -> tuple:
        return (self.q_conv1d, self.k_conv1d, self.v_conv1d)

    def init_state(self, batch_size: int):
        """A zero state and, with short convolutions, zero carried inputs: (S, cq, ck, cv)."""
        state = super().init_state(batch_size)
        if not self.use_short_conv:
            return state
        device = self.o_proj.weight.device
        return (state, *(conv.initial(batch_size, device=device) for conv in self._convolutions()))

    def split_entry(self, entry):
        if entry is None or not self.use_short_conv:
            return entry, None
        return entry[0], tuple(entry[1:])

    def join_entry(self, final_state, carried):
        return (final_state, *carried) if self.use_short_conv else final_state

    def call_inputs(self, x, carried):
        projected = (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        if self.use_short_conv:
            pairs = [conv(p, c) for conv, p, c in zip(self._convolutions(), projected, carried or (None,) * 3)]
            (q, k, v), carried = zip(*pairs)
        else:
            (q, k, v), carried = (F.silu(p) for p in projected), None
        beta = torch.sigmoid(self.b_proj(x))
        if self.allow_neg_eigval:
            beta = beta * 2
        q, k, v = self.heads(q, self.head_k_dim), self.heads(k, self.head_k_dim), self.heads(v, self.head_v_dim)
        return self.delta_inputs(x, q, k, v, beta), carried

    def merge_heads(self, o, x):
        """Each head's o RMS-normalised (in float32 at least) and scaled by `o_norm`, then gated."""
        wide = widened(o)
        o = (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.norm_eps)).to(o.dtype) * self.o_norm
        gate = self.output_gate(x)
        if gate is not None:
            o = o * self.GATE_ACTIVATION(self.heads(gate, self.head_v_dim))
        return o.flatten(-2)
