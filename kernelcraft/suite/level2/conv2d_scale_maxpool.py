# tiny: batch_size=2, in_channels=4, out_channels=8, height=16, width=16
# gpu: conv 19 GFLOP -> ~1 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 Conv2d, then multiplication by a scalar, then 2x2 max pooling."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, scale: float):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.scale = scale
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.conv(x) * self.scale)


batch_size = 32
in_channels = 32
out_channels = 64
height = 128
width = 128
kernel_size = 3
scale = -2.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, scale]
