# tiny: batch_size=8, dim1=64, dim2=128
# gpu: reads 512 MiB -> ~0.18 ms (memory bound)
import torch
import torch.nn as nn


class Model(nn.Module):
    """Sum reduction over a given dimension (keepdim=True)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


batch_size = 128
dim1 = 1024
dim2 = 1024
reduce_dim = 1


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [reduce_dim]
