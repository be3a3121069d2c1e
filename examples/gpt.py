"""A small GPT with attention written by hand, trained on random tokens: nothing is downloaded.

Its attention is the textbook form people write: `q @ k.transpose(-2, -1) / sqrt(d)`, a causal mask from a
registered `tril` buffer, `softmax`, dropout on the weights, `@ v`. That materialises a (batch, heads, t, t)
matrix per block, which `F.scaled_dot_product_attention` computes without; the four blocks are the repeated
modules that activation checkpointing wraps.

    python examples/gpt.py                  # train standalone
    advisor profile examples/gpt.py         # profile the loop as it is
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class RandomTokens(Dataset):
    """Fixed random token windows, each with its next-token targets."""

    def __init__(self, vocab: int, context: int, size: int = 4096, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (size, context + 1), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.tokens[index]
        return window[:-1], window[1:]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, written out by hand."""

    def __init__(self, width: int, heads: int, context: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.attn_dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.tril(torch.ones(context, context)).view(1, 1, context, context))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, t, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q = q.view(batch, t, self.heads, width // self.heads).transpose(1, 2)
        k = k.view(batch, t, self.heads, width // self.heads).transpose(1, 2)
        v = v.view(batch, t, self.heads, width // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(batch, t, width)
        return self.proj(y)


class Block(nn.Module):
    """Pre-norm attention and a feed-forward layer, each with its residual."""

    def __init__(self, width: int, heads: int, context: int, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, context, dropout)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, a stack of blocks, a language-model head."""

    def __init__(self, vocab: int, context: int, width: int = 128, layers: int = 4, heads: int = 4,
                 dropout: float = 0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(1, context, width))
        self.blocks = nn.ModuleList(Block(width, heads, context, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--log-every", type=int, default=20)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = RandomTokens(args.vocab, args.context)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = GPT(args.vocab, args.context, dropout=args.dropout).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model.train()
    for epoch in range(args.epochs):
        for step, (tokens, targets) in enumerate(loader):
            tokens, targets = tokens.to(device), targets.to(device)
            logits = model(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % args.log_every == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
            if args.max_steps is not None and step + 1 >= args.max_steps:
                return


if __name__ == "__main__":
    main()
