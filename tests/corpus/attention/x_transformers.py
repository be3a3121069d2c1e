"""x-transformers / lucidrains: einsum with spaced subscripts for the scores and the output, `* self.scale`,
a causal triangle built with `.triu(j - i + 1)` and filled with `-torch.finfo(dtype).max`, `dots.softmax`."""
import torch
import torch.nn as nn
from torch import einsum


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_kv = nn.Linear(dim, 2 * dim, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q = self.to_q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k, v = (z.view(b, n, self.heads, -1).transpose(1, 2) for z in self.to_kv(x).chunk(2, dim=-1))
        i, j = q.shape[-2], k.shape[-2]
        mask_value = -torch.finfo(q.dtype).max
        causal_mask = torch.ones((i, j), dtype=torch.bool).triu(j - i + 1)
        dots = einsum('b h i d, b h j d -> b h i j', q, k) * self.scale
        dots = dots.masked_fill(causal_mask, mask_value)
        attn = dots.softmax(dim=-1)
        out = einsum('b h i j, b h j d -> b h i d', attn, v)
        return self.to_out(out.transpose(1, 2).reshape(b, n, d))


def inputs():
    return (torch.randn(2, 12, 32),)
