# tiny: batch_size=32, in_features=128, out_features=128
# gpu: 2*B*in*out = 137 GFLOP -> ~5.5 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """Linear layer, plus an extra learned bias, then ReLU."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(0.1 * torch.randn(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x) + self.bias)


batch_size = 4096
in_features = 4096
out_features = 4096


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
