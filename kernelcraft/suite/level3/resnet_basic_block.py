# tiny: batch_size=2, channels=16, height=8, width=8
# gpu: 2 convs x 7.4 GFLOP + 2 GroupNorms over 25 MiB -> ~1 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """ResNet basic block with GroupNorm: relu(gn(conv(relu(gn(conv(x))))) + x)."""

    def __init__(self, channels: int, num_groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(num_groups, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.gn2 = nn.GroupNorm(num_groups, channels)
        with torch.no_grad():
            for gn in (self.gn1, self.gn2):
                gn.weight.copy_(1.0 + 0.1 * torch.randn(channels))
                gn.bias.copy_(0.1 * torch.randn(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        return torch.relu(out + x)


batch_size = 32
channels = 64
height = 56
width = 56
num_groups = 8


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, num_groups]
