"""A short causal depthwise convolution with SiLU over [B, T, D], its last inputs carried across
calls, as the delta-rule layers put one on each of their query, key and value projections."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class ShortConvolution(nn.Module):
    """y_t = silu(sum_{j < W} w_j * x_{t - W + 1 + j}) per channel, with x_t for t < 0 taken from
    the carried inputs (zeros when none are given)."""

    def __init__(self, channels: int, kernel_size: int = 4, bias: bool = False):
        super().__init__()
        self.channels, self.kernel_size = channels, kernel_size
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)

    def initial(self, batch_size: int, dtype=torch.float32, device=None) -> torch.Tensor:
        """The carried inputs of a fresh sequence: zeros [B, D, W - 1]."""
        return torch.zeros(batch_size, self.channels, self.kernel_size - 1, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, carried: torch.Tensor | None = None) -> tuple:
        """(y [B, T, D], the last W - 1 inputs [B, D, W - 1] to carry into the next call).

        The carried inputs are read, never written into, and the inputs carried on are a tensor of
        their own (not a view, which a user's in-place detach_ of the cache would refuse)."""
        x = x.transpose(1, 2)
        if carried is None:
            carried = self.initial(x.shape[0], x.dtype, x.device)
        full = torch.cat([carried.to(x.dtype), x], dim=-1)
        y = F.conv1d(full, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype),
                     groups=self.channels)
        return F.silu(y).transpose(1, 2), full[..., full.shape[-1] - (self.kernel_size - 1):].clone()
