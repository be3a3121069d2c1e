"""Issue 67's GPT block: `(q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)`, an inline `triu` of booleans
filled with -inf, `F.softmax(att, dim=-1) @ v` (refused before the run-time check)."""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return x + self.proj(y.transpose(1, 2).reshape(b, t, d))


class GPT(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, layers=2, context=32):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Embedding(context, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.blocks(x))


def train_step(model, batch, optimizer):
    inputs, targets = batch[:, :-1], batch[:, 1:]
    optimizer.zero_grad()
    loss = F.cross_entropy(model(inputs).reshape(-1, 64), targets.reshape(-1))
    loss.backward()
    optimizer.step()
    return loss.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (args.steps, 8, 33), generator=torch.Generator().manual_seed(0))
    for step in range(args.steps):
        print(f"step {step}: loss {train_step(model, data[step], optimizer)!r}")


if __name__ == "__main__":
    main()
