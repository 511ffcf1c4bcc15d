# tiny: batch_size=16, dim=4096
# gpu: 256 MiB in + 256 MiB out -> ~0.17 ms (memory bound)
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Elementwise GELU (exact, erf-based)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


batch_size = 4096
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
