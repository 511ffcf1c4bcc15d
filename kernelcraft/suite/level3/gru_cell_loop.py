# tiny: seq_len=8, batch_size=4, input_size=16, hidden_size=32
# gpu: 64 steps x 1 GFLOP of small GEMMs + gate math -> ~3-6 ms (launch bound unless fused)
import torch
import torch.nn as nn


class Model(nn.Module):
    """GRU unrolled over time with nn.GRUCell from a zero state; returns all hidden states (T, B, H)."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.cell = nn.GRUCell(input_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[1], self.hidden_size)
        outputs = []
        for t in range(x.shape[0]):
            h = self.cell(x[t], h)
            outputs.append(h)
        return torch.stack(outputs, dim=0)


seq_len = 64
batch_size = 128
input_size = 256
hidden_size = 1024


def get_inputs():
    return [torch.randn(seq_len, batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden_size]
