# tiny: batch_size=32, in_features=256, out_features=64
# gpu: 2*B*in*out = 34 GFLOP -> ~1.4 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """Linear layer, scaling, clamp, then logsumexp over the output features (keepdim)."""

    def __init__(self, in_features: int, out_features: int, scale: float, clamp_min: float, clamp_max: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x) * self.scale
        y = torch.clamp(y, min=self.clamp_min, max=self.clamp_max)
        return torch.logsumexp(y, dim=1, keepdim=True)


batch_size = 8192
in_features = 8192
out_features = 256
scale = 4.0
clamp_min = -5.0
clamp_max = 5.0


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale, clamp_min, clamp_max]
