# tiny: seq_len=8, batch_size=4, input_size=16, hidden_size=32
# gpu: 64 steps x 0.8 GFLOP of small GEMMs; the input projection can be batched over all steps -> ~4 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """Elman RNN h_t = tanh(W_ih x_t + b + W_hh h_{t-1}) unrolled over T steps; returns the final hidden state."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.ih = nn.Linear(input_size, hidden_size)
        self.hh = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        h = h0
        for t in range(x.shape[0]):
            h = torch.tanh(self.ih(x[t]) + self.hh(h))
        return h


seq_len = 64
batch_size = 256
input_size = 512
hidden_size = 1024


def get_inputs():
    return [torch.randn(seq_len, batch_size, input_size), torch.randn(batch_size, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size]
