"""Hugging Face Llama's eager attention: `transpose(2, 3)`, `* self.scaling`, a 4-D additive causal mask
(0 and the dtype's minimum) sliced under an `if`, softmax in float32 cast back to the query's dtype,
nn.functional.dropout with `training=self.training`."""
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.head_dim = hidden // heads
        self.heads = heads
        self.scaling = self.head_dim ** -0.5
        self.attention_dropout = 0.1
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, hidden_states, attention_mask=None):
        b, t, _ = hidden_states.shape
        shape = (b, t, self.heads, self.head_dim)
        query_states = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * self.scaling
        if attention_mask is not None:
            causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
            attn_weights = attn_weights + causal_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
        attn_weights = nn.functional.dropout(attn_weights, p=self.attention_dropout, training=self.training)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
        return self.o_proj(attn_output.reshape(b, t, -1))


def inputs():
    t = 12
    mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None].expand(2, 1, t, t)
    return torch.randn(2, t, 32), mask
