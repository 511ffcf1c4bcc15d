# tiny: M=256, K=1024
# gpu: reads A = 512 MiB once -> ~0.18 ms (memory bound)
import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix-vector product C = A @ B with A (M, K) and B (K, 1)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


M = 8192
K = 16384


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, 1)]


def get_init_inputs():
    return []
