# tiny: batch_size=16, dim=4096
# gpu: 256 MiB in + 256 MiB out -> ~0.17 ms fused (each unfused op re-reads and re-writes)
import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise chain: clamp(tanh(x * 2 + 1) * 0.5, -0.45, 0.45)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 2.0 + 1.0
        x = torch.tanh(x)
        x = x * 0.5
        return torch.clamp(x, min=-0.45, max=0.45)


batch_size = 4096
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
