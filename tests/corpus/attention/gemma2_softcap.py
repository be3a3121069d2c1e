"""Gemma-2's attention logit soft-capping: the scores divided by the cap, tanh, times the cap, then the causal
mask and a float32 softmax."""
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4, softcap=2.0):
        super().__init__()
        self.heads = heads
        self.scaling = (dim // heads) ** -0.5
        self.attn_logit_softcapping = softcap
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
        attn_weights = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        attn_weights = attn_weights / self.attn_logit_softcapping
        attn_weights = torch.tanh(attn_weights)
        attn_weights = attn_weights * self.attn_logit_softcapping
        attn_weights = attn_weights.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(attn_weights, v).transpose(1, 2).reshape(b, t, d)


def inputs():
    return (torch.randn(2, 12, 32) * 3,)
