# tiny: batch_size=2, seq_len=16, embed_dim=64, num_heads=4, ffn_dim=128
# gpu: qkv 26 + attention 17 + out 9 + MLP 69 GFLOP -> ~5 ms
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Pre-LN transformer encoder layer: x + MHA(LN(x)), then x + MLP(LN(x)) with GELU."""

    def __init__(self, embed_dim: int, num_heads: int, ffn_dim: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.ln1 = nn.LayerNorm(embed_dim)
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.ln2 = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, e = x.shape
        qkv = self.qkv(x).reshape(b, s, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) / self.head_dim ** 0.5
        y = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.proj(y.transpose(1, 2).reshape(b, s, e))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


batch_size = 4
seq_len = 1024
embed_dim = 1024
num_heads = 16
ffn_dim = 4096


def get_inputs():
    return [torch.randn(batch_size, seq_len, embed_dim)]


def get_init_inputs():
    return [embed_dim, num_heads, ffn_dim]
