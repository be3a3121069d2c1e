"""Hugging Face GPT-2's eager `_attn`: torch.matmul with `transpose(-1, -2)`, divided by a `torch.full` of
sqrt(width), a boolean causal buffer through `torch.where` with the dtype's minimum, an additive mask under
an `if`, softmax cast back, dropout; it returns the weights as well."""
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, d=32, heads=4, positions=16):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)
        self.attn_dropout = nn.Dropout(0.1)
        self.register_buffer("bias", torch.tril(torch.ones((positions, positions), dtype=torch.bool)).view(
            1, 1, positions, positions))

    def forward(self, x, attention_mask=None):
        b, t, d = x.shape
        query, key, value = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.c_attn(x).split(d, dim=2))
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        attn_weights = attn_weights / torch.full([], value.size(-1) ** 0.5, dtype=attn_weights.dtype)
        causal_mask = self.bias[:, :, :t, :t]
        attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), torch.finfo(query.dtype).min)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights.type(value.dtype)
        attn_weights = self.attn_dropout(attn_weights)
        attn_output = torch.matmul(attn_weights, value)
        return attn_output, attn_weights


def inputs():
    return (torch.randn(2, 12, 32),)
