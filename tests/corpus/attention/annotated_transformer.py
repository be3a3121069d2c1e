"""The Annotated Transformer's `attention()`, as a module: `d_k = query.size(-1)`, torch.matmul with
`transpose(-2, -1)` `/ math.sqrt(d_k)`, a padding mask `mask == 0` filled with -1e9 under an `if`,
`scores.softmax(dim=-1)`."""
import math

import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, d_model=32, h=4):
        super().__init__()
        self.d_k = d_model // h
        self.h = h
        self.linears = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(4)])

    def forward(self, x, mask=None):
        nbatches = x.size(0)
        query, key, value = [lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2) for lin in self.linears[:3]]
        d_k = query.size(-1)
        scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        p_attn = scores.softmax(dim=-1)
        x = torch.matmul(p_attn, value)
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        return self.linears[-1](x)


def inputs():
    mask = torch.ones(3, 1, 1, 12)
    mask[1, ..., 8:] = 0
    mask[2, ..., 3:] = 0
    return torch.randn(3, 12, 32), mask
