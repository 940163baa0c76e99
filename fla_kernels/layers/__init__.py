"""torch.nn layers over the kernels, with a Cache carrying recurrent state across calls."""
from fla_kernels.layers.cache import Cache
from fla_kernels.layers.gated_linear_attention import GatedLinearAttention
from fla_kernels.layers.gated_slot_attention import GatedSlotAttention
from fla_kernels.layers.linear_attention import LinearAttention
from fla_kernels.layers.rwkv6_attention import RWKV6Attention

__all__ = ["Cache", "GatedLinearAttention", "GatedSlotAttention", "LinearAttention", "RWKV6Attention"]
