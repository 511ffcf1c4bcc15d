# tiny: batch_size=2, seq_len=16, embed_dim=64, num_heads=4
# gpu: qkv 52 + attention 34 + out proj 17 GFLOP, 512 MiB scores -> ~4-5 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """Multi-head self-attention written with Linear layers: QKV projection, softmax attention, output projection."""

    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, e = x.shape
        qkv = self.qkv(x).reshape(b, s, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) / self.head_dim ** 0.5
        attn = torch.softmax(scores, dim=-1)
        y = torch.matmul(attn, v).transpose(1, 2).reshape(b, s, e)
        return self.out(y)


batch_size = 8
seq_len = 1024
embed_dim = 1024
num_heads = 16


def get_inputs():
    return [torch.randn(batch_size, seq_len, embed_dim)]


def get_init_inputs():
    return [embed_dim, num_heads]
