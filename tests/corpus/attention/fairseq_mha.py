"""fairseq's MultiheadAttention: heads folded into the batch (3-D), `q *= self.scaling`, torch.bmm with
`k.transpose(1, 2)`, the additive mask `+=` under an `if`, a float32 softmax made back with
`type_as(attn_weights)` (the scores read after the softmax), torch.bmm with v."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, embed_dim=32, num_heads=4):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.dropout = 0.1

    def forward(self, query, attn_mask=None):
        tgt_len, bsz, embed_dim = query.size()
        q = self.q_proj(query)
        q *= self.scaling
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = self.k_proj(query).contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = self.v_proj(query).contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        if attn_mask is not None:
            attn_weights += attn_mask
        attn_weights_float = F.softmax(attn_weights, dim=-1, dtype=torch.float32)
        attn_weights = attn_weights_float.type_as(attn_weights)
        attn_probs = F.dropout(attn_weights, p=self.dropout, training=self.training)
        attn = torch.bmm(attn_probs, v)
        return attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)


def inputs():
    t = 12
    return torch.randn(t, 2, 32), torch.full((t, t), float("-inf")).triu(1)
