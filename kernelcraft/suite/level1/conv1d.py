# tiny: batch_size=2, in_channels=8, out_channels=16, length=256
# gpu: 2*B*L*Cout*Cin*K = 21 GFLOP -> ~1-2 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """1D convolution (valid padding, stride 1) with bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 32
in_channels = 64
out_channels = 128
length = 8192
kernel_size = 5


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
