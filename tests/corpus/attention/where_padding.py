"""A boolean key-padding mask through `torch.where(keep, scores, float("-inf"))` and `torch.softmax(s, -1)`."""
import math

import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, keep):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
        s = q @ k.mT / math.sqrt(q.shape[-1])
        s = torch.where(keep[:, None, None, :], s, float("-inf"))
        w = torch.softmax(s, -1)
        return (w @ v).transpose(1, 2).reshape(b, t, d)


def inputs():
    keep = torch.ones(3, 12, dtype=torch.bool)
    keep[1, 7:] = False
    return torch.randn(3, 12, 32), keep
