"""lucidrains' vit-pytorch Attention: `torch.matmul(q, k.transpose(-1, -2)) * self.scale` and the softmax a
module of its own (`self.attend = nn.Softmax(dim=-1)`)."""
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.attend = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(0.1)
        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        attn = self.attend(dots)
        attn = self.dropout(attn)
        out = torch.matmul(attn, v)
        return self.to_out(out.transpose(1, 2).reshape(b, n, d))


def inputs():
    return (torch.randn(2, 17, 32),)
