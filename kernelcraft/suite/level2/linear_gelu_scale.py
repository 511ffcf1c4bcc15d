# tiny: batch_size=32, in_features=128, out_features=128
# gpu: 2*B*in*out = 69 GFLOP -> ~2.7 ms
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, then GELU, then multiplication by a constant scale."""

    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x)) * self.scale


batch_size = 2048
in_features = 4096
out_features = 4096
scale = 1.5


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
