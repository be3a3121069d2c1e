"""Hugging Face BERT's eager self-attention: separate Linears, torch.matmul with `transpose(-1, -2)`,
`/ math.sqrt(self.attention_head_size)`, the extended padding mask `(1 - mask) * -10000` added under an `if`,
nn.functional.softmax, a dropout module (the weights not returned: output_attentions off)."""
import math

import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.num_attention_heads = heads
        self.attention_head_size = hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(0.1)

    def transpose_for_scores(self, x):
        return x.view(*x.shape[:2], self.num_attention_heads, self.attention_head_size).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        if attention_mask is not None:
            attention_scores = attention_scores + attention_mask
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)
        attention_probs = self.dropout(attention_probs)
        context_layer = torch.matmul(attention_probs, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        return context_layer.view(*context_layer.shape[:2], -1)


def inputs():
    keep = torch.ones(3, 12)
    keep[1, 9:] = 0  # padding at the end of the second sequence
    keep[2, 5:] = 0
    return torch.randn(3, 12, 32), (1.0 - keep[:, None, None, :]) * -10000.0
