# tiny: batch_size=2, in_channels=4, out_channels=8, height=16, width=16
# gpu: 2*B*H*W*Cout*Cin*9 = 39 GFLOP -> ~1.5-3 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """2D convolution, 3x3 kernel, stride 1, padding 1, with bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 16
in_channels = 64
out_channels = 128
height = 128
width = 128
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
