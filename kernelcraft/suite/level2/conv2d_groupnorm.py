# tiny: batch_size=2, in_channels=4, out_channels=16, height=16, width=16
# gpu: conv 19 GFLOP + GroupNorm over 128 MiB -> ~1.2 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 Conv2d (padding 1) followed by GroupNorm with learned affine parameters."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, num_groups: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.gn = nn.GroupNorm(num_groups, out_channels)
        with torch.no_grad():
            self.gn.weight.copy_(1.0 + 0.1 * torch.randn(out_channels))
            self.gn.bias.copy_(0.1 * torch.randn(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn(self.conv(x))


batch_size = 32
in_channels = 32
out_channels = 64
height = 128
width = 128
kernel_size = 3
num_groups = 8


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]
