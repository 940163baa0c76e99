"""torch.nn layers over the kernels, with a Cache carrying recurrent state across calls."""
from fla_kernels.layers.cache import Cache
from fla_kernels.layers.delta_net import DeltaNet
from fla_kernels.layers.gated_deltanet import GatedDeltaNet
from fla_kernels.layers.gated_linear_attention import GatedLinearAttention
from fla_kernels.layers.gated_slot_attention import GatedSlotAttention
from fla_kernels.layers.kimi_delta_attention import KimiDeltaAttention
from fla_kernels.layers.linear_attention import LinearAttention
from fla_kernels.layers.rwkv6_attention import RWKV6Attention

__all__ = ["Cache", "DeltaNet", "GatedDeltaNet", "GatedLinearAttention", "GatedSlotAttention",
           "KimiDeltaAttention", "LinearAttention", "RWKV6Attention"]
