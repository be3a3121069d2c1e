"""PyTorch's own nn.MultiheadAttention (the Transformer tutorial's encoder): fused already, nothing to rewrite."""
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def inputs():
    return (torch.randn(2, 12, 32),)
