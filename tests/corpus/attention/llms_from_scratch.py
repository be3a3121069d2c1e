"""Raschka's LLMs-from-scratch CausalAttention: 3-D, `keys.transpose(1, 2)`, an in-place `masked_fill_` with
a `triu(..., diagonal=1)` buffer made `.bool()`, and the scale inside the softmax call."""
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, d_in=32, d_out=32, context_length=16):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=False)
        self.W_key = nn.Linear(d_in, d_out, bias=False)
        self.W_value = nn.Linear(d_in, d_out, bias=False)
        self.dropout = nn.Dropout(0.1)
        self.register_buffer('mask', torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)
        attn_scores = queries @ keys.transpose(1, 2)
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)
        context_vec = attn_weights @ values
        return context_vec


def inputs():
    return (torch.randn(2, 12, 32),)
