"""The chained-method spelling (as in PyTorch's inductor SDPA patterns): torch.matmul, `qk.div(...)` under a
new name, `.softmax(dim=-1)`, torch.nn.functional.dropout, `.matmul(value)`."""
import math

import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, t, d = x.shape
        query, key, value = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
        inv_scale_factor = math.sqrt(self.heads)
        qk = torch.matmul(query, key.transpose(-2, -1))
        scaled_qk = qk.div(inv_scale_factor)
        softmax_qk = scaled_qk.softmax(dim=-1)
        dropout_qk = torch.nn.functional.dropout(softmax_qk, p=0.1, training=self.training)
        output = dropout_qk.matmul(value)
        return output.transpose(1, 2).reshape(b, t, d)


def inputs():
    return (torch.randn(2, 12, 32),)
