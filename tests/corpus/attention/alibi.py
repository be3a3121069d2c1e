"""ALiBi (BLOOM, MPT): a per-head linear bias of the key's distance added to the scores, then the causal
mask, F.softmax."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4, context=16):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        slopes = torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)])
        distance = torch.arange(context)[None, :] - torch.arange(context)[:, None]
        self.register_buffer("alibi", slopes[:, None, None] * distance[None].float())
        self.register_buffer("causal", torch.tril(torch.ones(context, context)))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
        att = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1))
        att = att + self.alibi[:, :t, :t]
        att = att.masked_fill(self.causal[:t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        return (att @ v).transpose(1, 2).reshape(b, t, d)


def inputs():
    return (torch.randn(2, 12, 32),)
