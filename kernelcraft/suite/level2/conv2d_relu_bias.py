# tiny: batch_size=2, in_channels=4, out_channels=8, height=16, width=16
# gpu: 2*B*Ho*Wo*Cout*Cin*9 = 19 GFLOP -> ~1 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 Conv2d, then ReLU, then adding a learned per-channel bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(0.1 * torch.randn(out_channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)) + self.bias


batch_size = 32
in_channels = 32
out_channels = 64
height = 128
width = 128
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
