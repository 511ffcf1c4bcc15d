# tiny: batch_size=16, in_features=128, hidden_features=128, out_features=32
# gpu: 2*B*(in*h + h*h + h*out) = 77 GFLOP -> ~3 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """Three-layer MLP: Linear-ReLU-Linear-ReLU-Linear."""

    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden_features),
            nn.ReLU(),
            nn.Linear(hidden_features, hidden_features),
            nn.ReLU(),
            nn.Linear(hidden_features, out_features),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


batch_size = 1024
in_features = 4096
hidden_features = 4096
out_features = 1024


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, hidden_features, out_features]
