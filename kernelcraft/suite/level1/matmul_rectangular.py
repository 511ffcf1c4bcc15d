# tiny: M=64, K=512, N=96
# gpu: 2*M*K*N = 34 GFLOP -> ~1.4 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """Rectangular matmul C = A @ B with A (M, K), B (K, N) and a long inner dimension K."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


M = 1024
K = 8192
N = 2048


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
