# tiny: batch_size=32, in_features=128, out_features=256
# gpu: 2*B*in*out = 69 GFLOP -> ~2.7 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """Linear layer followed by softmax over the output features."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(x), dim=1)


batch_size = 2048
in_features = 4096
out_features = 4096


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
