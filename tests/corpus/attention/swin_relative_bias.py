"""Swin's WindowAttention: `q = q * self.scale`, `q @ k.transpose(-2, -1)`, then a learned relative position
bias gathered from a table and added to the scores before `self.softmax`."""
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=32, window=4, num_heads=4):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.randn((2 * window - 1) ** 2, num_heads))
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + window - 1
        self.register_buffer("relative_position_index", relative[..., 0] * (2 * window - 1) + relative[..., 1])
        self.qkv = nn.Linear(dim, dim * 3)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
        attn = attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)
        attn = self.softmax(attn)
        return (attn @ v).transpose(1, 2).reshape(B_, N, C)


def inputs():
    return (torch.randn(2, 16, 32),)
