"""What the attention layers share: projections into heads, the kernel call with the cache,
heads merged before the output projection."""
from __future__ import annotations

import torch
import torch.nn as nn

from fla_kernels.layers.cache import Cache


class RecurrentAttention(nn.Module):
    """A layer over one op family. Subclasses set `MODES` ({mode: kernel}), add the projections
    beyond query, key and value, and define `kernel_inputs(x)` (the op's positional tensors,
    [B, T, H, *]), `state_shapes()` and, if they gate the output, `output_gate(x)`. A layer that
    carries more than the kernel's state in its cache entry (short convolutions' inputs)
    overrides `split_entry`, `join_entry` and `call_inputs`; one that normalises the heads'
    output overrides `merge_heads`."""

    MODES: dict = {}
    KERNEL_OPTIONS: dict = {}   # keyword arguments of every kernel call (use_qk_l2norm_in_kernel)

    def __init__(self, hidden_size: int, num_heads: int, expand_k: float, expand_v: float,
                 mode: str, layer_idx: int | None, query: str = "q"):
        """Key and value widths are hidden_size * expand_k (expand_v), split over the heads; the
        query, key and value projections are `<query>_proj`, `k_proj`, `v_proj`."""
        super().__init__()
        if mode not in self.MODES:
            raise ValueError(f"{type(self).__name__}: unknown mode '{mode}'; choose from "
                             f"{', '.join(self.MODES)}.")
        self.key_dim, self.value_dim = round(hidden_size * expand_k), round(hidden_size * expand_v)
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.head_k_dim, self.head_v_dim = self.key_dim // num_heads, self.value_dim // num_heads
        self.mode, self.layer_idx = mode, 0 if layer_idx is None else layer_idx
        self.kernel = self.MODES[mode]  # any function with the op's public signature can stand in
        self.o_proj = nn.Linear(num_heads * self.head_v_dim, hidden_size, bias=False)
        setattr(self, f"{query}_proj", nn.Linear(hidden_size, self.key_dim, bias=False))
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)

    def heads(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """[B, T, H * dim] -> [B, T, H, dim]."""
        return x.unflatten(-1, (self.num_heads, dim))

    def kernel_inputs(self, x: torch.Tensor) -> tuple:
        raise NotImplementedError

    def state_shapes(self) -> list[tuple]:
        """Per-sequence shapes of the state's tensors (without the batch dimension)."""
        raise NotImplementedError

    def output_gate(self, x: torch.Tensor):
        return None

    def init_state(self, batch_size: int):
        """A zero state (float32) for `batch_size` sequences: a tensor, or a tuple for several."""
        device = self.o_proj.weight.device
        zeros = tuple(torch.zeros(batch_size, *shape, dtype=torch.float32, device=device)
                      for shape in self.state_shapes())
        return zeros[0] if len(zeros) == 1 else zeros

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, past_key_values=None,
                use_cache: bool = False, output_attentions: bool = False, **kwargs):
        """(y [B, T, hidden_size], None, the cache or None). `past_key_values`: a Cache (or a
        list of states) whose entry `layer_idx` is this layer's state entering the call."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError(f"{type(self).__name__}: padding masks are not supported; pass "
                             "attention_mask=None or all ones.")
        if past_key_values is not None and not isinstance(past_key_values, Cache):
            past_key_values = Cache.from_legacy_cache(past_key_values)
        entry = None if past_key_values is None else past_key_values[self.layer_idx]
        state, carried = self.split_entry(entry)
        inputs, carried = self.call_inputs(hidden_states, carried)
        o, final = self.kernel(*inputs, initial_state=state, output_final_state=use_cache,
                               **self.KERNEL_OPTIONS)
        if use_cache:
            past_key_values = Cache() if past_key_values is None else past_key_values
            past_key_values.update(self.join_entry(final, carried), self.layer_idx, hidden_states.shape[1])
        return self.o_proj(self.merge_heads(o, hidden_states)), None, past_key_values

    def split_entry(self, entry):
        """(the kernel's initial state, what else the layer carries) of a cache entry (None for a
        fresh sequence): here the entry is the kernel's state."""
        return entry, None

    def join_entry(self, final_state, carried):
        """The cache entry after a call: here the kernel's final state."""
        return final_state

    def call_inputs(self, x: torch.Tensor, carried) -> tuple:
        """(the kernel's positional inputs, what the layer carries into the next call)."""
        return self.kernel_inputs(x), None

    def merge_heads(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The kernel's o [B, T, H, V] as o_proj takes it, [B, T, H * V], gated by `output_gate`."""
        gate = self.output_gate(x)
        o = o.flatten(-2)
        return o if gate is None else o * gate
