# tiny: batch_size=2, channels=8, height=32, width=32
# gpu: 256 MiB in + 256 MiB out, 2.4 GFLOP -> ~0.2-0.4 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """Depthwise 2D convolution (groups = channels), 3x3 kernel, padding 1, with bias."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 16
channels = 64
height = 256
width = 256
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, kernel_size]
