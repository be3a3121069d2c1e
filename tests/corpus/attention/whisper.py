"""OpenAI whisper's qkv_attention: q and k each scaled by width ** -0.25, k permuted to (b, h, d, t) so the
product is `q @ k`, an additive -inf triangle under an `if`, the scores made float, softmax cast back; it
returns `qk.detach()` as well."""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, n_state=32, n_head=4, n_ctx=16):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)
        self.register_buffer("mask", torch.empty(n_ctx, n_ctx).fill_(-np.inf).triu_(1), persistent=False)

    def forward(self, x):
        n_batch, n_ctx, n_state = x.shape
        scale = (n_state // self.n_head) ** -0.25
        q = self.query(x).view(*x.shape[:2], self.n_head, -1).permute(0, 2, 1, 3) * scale
        k = self.key(x).view(*x.shape[:2], self.n_head, -1).permute(0, 2, 3, 1) * scale
        v = self.value(x).view(*x.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)
        qk = q @ k
        if self.mask is not None:
            qk = qk + self.mask[:n_ctx, :n_ctx]
        qk = qk.float()
        w = F.softmax(qk, dim=-1).to(q.dtype)
        out = (w @ v).permute(0, 2, 1, 3).flatten(start_dim=2)
        return self.out(out), qk.detach()


def inputs():
    return (torch.randn(2, 12, 32),)
