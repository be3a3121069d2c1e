"""fairseq's layout without the float32 round trip: 3-D heads-in-batch, pre-scaled q, torch.bmm with
`k.transpose(1, 2)`, `attn_weights += attn_mask` under an `if`, F.dropout, torch.bmm with v."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, embed_dim=32, num_heads=4):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim)
        self.dropout = 0.1

    def forward(self, query, attn_mask=None):
        tgt_len, bsz, embed_dim = query.size()
        q, k, v = (z.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
                   for z in self.in_proj(query).chunk(3, dim=-1))
        q = q * self.scaling
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        if attn_mask is not None:
            attn_weights += attn_mask
        attn_weights = F.softmax(attn_weights, dim=-1)
        attn_probs = F.dropout(attn_weights, p=self.dropout, training=self.training)
        attn = torch.bmm(attn_probs, v)
        return attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)


def inputs():
    t = 12
    return torch.randn(t, 2, 32), torch.full((t, t), float("-inf")).triu(1)
