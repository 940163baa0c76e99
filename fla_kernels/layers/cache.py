"""Recurrent state carried across calls, one entry per layer."""
from __future__ import annotations


def _detached(state):
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return tuple(s.detach() for s in state)
    return state.detach()


class Cache:
    """The state of each layer (a tensor, or a tuple of tensors for gated slot attention) and the
    number of tokens it has seen.

    `update` replaces the stored state with the new one; it never writes into a stored tensor, so a
    state that autograd saved for a backward (the initial state of the call that produced it)
    stays intact.
    """

    def __init__(self, states=None):
        self.states = list(states or [])
        self.seen_tokens = [0] * len(self.states)

    @classmethod
    def from_legacy_cache(cls, states) -> "Cache":
        """A cache holding `states` (a list indexed by layer)."""
        return cls(states)

    def to_legacy_cache(self) -> list:
        return list(self.states)

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, layer_idx: int):
        return self.states[layer_idx] if layer_idx < len(self.states) else None

    def update(self, state, layer_idx: int, new_tokens: int):
        """Store `state` as layer `layer_idx`'s, after `new_tokens` more tokens."""
        while len(self.states) <= layer_idx:
            self.states.append(None)
            self.seen_tokens.append(0)
        self.states[layer_idx] = state
        self.seen_tokens[layer_idx] += new_tokens

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens[layer_idx] if layer_idx < len(self.seen_tokens) else 0

    def detach(self) -> "Cache":
        """The same states cut from the graph (truncated backpropagation between segments)."""
        cache = Cache([_detached(s) for s in self.states])
        cache.seen_tokens = list(self.seen_tokens)
        return cache
