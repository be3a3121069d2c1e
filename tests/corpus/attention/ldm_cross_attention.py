"""latent-diffusion's CrossAttention: heads folded into the batch, 3-D einsum `b i d, b j d -> b i j` with
`* self.scale`, `sim.softmax(dim=-1)`, einsum with v; queries and keys of different lengths (a context)."""
import torch
import torch.nn as nn
from torch import einsum


class Attention(nn.Module):
    def __init__(self, query_dim=32, context_dim=24, heads=4):
        super().__init__()
        self.heads = heads
        self.scale = (query_dim // heads) ** -0.5
        self.to_q = nn.Linear(query_dim, query_dim, bias=False)
        self.to_k = nn.Linear(context_dim, query_dim, bias=False)
        self.to_v = nn.Linear(context_dim, query_dim, bias=False)
        self.to_out = nn.Linear(query_dim, query_dim)

    def forward(self, x, context):
        h = self.heads
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        q, k, v = (t.view(t.shape[0], t.shape[1], h, -1).transpose(1, 2).reshape(t.shape[0] * h, t.shape[1], -1)
                   for t in (q, k, v))
        sim = einsum('b i d, b j d -> b i j', q, k) * self.scale
        attn = sim.softmax(dim=-1)
        out = einsum('b i j, b j d -> b i d', attn, v)
        out = out.view(x.shape[0], h, x.shape[1], -1).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        return self.to_out(out)


def inputs():
    return torch.randn(2, 10, 32), torch.randn(2, 7, 24)
