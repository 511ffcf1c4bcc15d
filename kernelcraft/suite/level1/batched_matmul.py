# tiny: batch_size=4, m=32, k=64, n=48
# gpu: 2*b*m*k*n = 17 GFLOP, 256 MiB traffic -> ~0.7 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """Batched matrix multiplication C[b] = A[b] @ B[b]."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.bmm(A, B)


batch_size = 128
m = 512
k = 256
n = 512


def get_inputs():
    return [torch.randn(batch_size, m, k), torch.randn(batch_size, k, n)]


def get_init_inputs():
    return []
