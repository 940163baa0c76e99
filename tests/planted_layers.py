"""Layers with planted bugs, for testing the harness's layer check (harness/checks/layer.py)."""
from fla_kernels.layers import DeltaNet
from fla_kernels.layers.short_convolution import ShortConvolution


class ConvolutionForgettingItsInputs(ShortConvolution):
    """Starts every call from zeros instead of the carried inputs (a cache that drops the
    convolutions' state): one call is right, a sequence split through the cache is not."""

    def forward(self, x, carried=None):
        return super().forward(x, None)


class DeltaNetForgettingConvolutionInputs(DeltaNet):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("q_conv1d", "k_conv1d", "v_conv1d"):
            conv = getattr(self, name)
            planted = ConvolutionForgettingItsInputs(conv.channels, conv.kernel_size)
            planted.load_state_dict(conv.state_dict())
            setattr(self, name, planted)
