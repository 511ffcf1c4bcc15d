# tiny: batch_size=32, in_features=128, out_features=128
# gpu: as written 137 GFLOP -> ~5.5 ms; summing the weight rows first turns it into a GEMV
import torch
import torch.nn as nn


class Model(nn.Module):
    """Linear layer followed by a sum over the output features (keepdim)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(self.linear(x), dim=1, keepdim=True)


batch_size = 4096
in_features = 4096
out_features = 4096


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
