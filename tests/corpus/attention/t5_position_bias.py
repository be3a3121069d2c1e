"""T5's attention: no scale, a relative position bias from bucketed distances (an Embedding) added with
`scores += position_bias`, a float softmax `type_as` the scores' dtype."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4, buckets=8):
        super().__init__()
        self.heads = heads
        self.buckets = buckets
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.relative_attention_bias = nn.Embedding(buckets, heads)

    def forward(self, x):
        b, t, d = x.shape
        shape = (b, t, self.heads, -1)
        q, k, v = (proj(x).view(shape).transpose(1, 2) for proj in (self.q, self.k, self.v))
        half = self.buckets // 2
        relative = (torch.arange(t)[None, :] - torch.arange(t)[:, None]).clamp(-half, half - 1)
        position_bias = self.relative_attention_bias(relative + half).permute(2, 0, 1).unsqueeze(0)
        scores = torch.matmul(q, k.transpose(3, 2))
        scores += position_bias
        attn_weights = F.softmax(scores.float(), dim=-1).type_as(q)
        return torch.matmul(attn_weights, v).transpose(1, 2).reshape(b, t, d)


def inputs():
    return (torch.randn(2, 12, 32),)
