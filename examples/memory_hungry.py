"""A long-context language model with hand-written attention: its activations outgrow a memory cap.

Attention written out as `softmax(q @ k.T / sqrt(d)) @ v` keeps a batch × heads × context × context
matrix per layer for the backward pass, so activation memory grows with the square of the context and
linearly with the batch, while the parameters stay small (0.8 MB). At the configured batch of 16 a
profiled step holds about 1.7 GiB at its peak on the CPU, so under `--memory-limit 1.2G` it runs out of
memory. Under the same cap, bf16 autocast (half-size activations; about 0.9 GiB), checkpointing the four
blocks (about 0.85 GiB) or micro-batches of 4 with gradient accumulation (the same effective batch of 16;
about 0.45 GiB) fit.

The data is generated (a seeded sequence of repeating patterns), so nothing is downloaded.

    python examples/memory_hungry.py                                            # train standalone
    advisor profile examples/memory_hungry.py:train_step --memory-limit 1.2G    # out of memory, then recovered
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class PatternText(Dataset):
    """Windows of a token stream built from short repeating patterns: next-token targets are learnable."""

    def __init__(self, context: int, windows: int = 256, vocab: int = 64, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        pieces, length = [], 0
        while length < (windows + 1) * context:
            size, repeats = torch.randint(3, 12, (2,), generator=generator).tolist()
            pieces.append(torch.randint(0, vocab, (size,), generator=generator).repeat(repeats))
            length += size * repeats
        self.tokens = torch.cat(pieces)
        self.context, self.windows, self.vocab = context, windows, vocab

    def __len__(self) -> int:
        return self.windows

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.tokens[index * self.context : (index + 1) * self.context + 1]
        return chunk[:-1], chunk[1:]


class Attention(nn.Module):
    """Causal self-attention written out: the full attention matrix is kept for the backward pass."""

    def __init__(self, width: int, heads: int, context: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.register_buffer("future", torch.triu(torch.ones(context, context, dtype=torch.bool), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q / math.sqrt(width // self.heads)) @ k.transpose(-2, -1)
        weights = scores.masked_fill_(self.future[:length, :length], float("-inf")).softmax(dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    """Pre-norm attention and a small feed-forward layer."""

    def __init__(self, width: int, heads: int, context: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = Attention(width, heads, context)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.ff(self.norm2(x))


class LongContextModel(nn.Module):
    """Token and position embeddings, a stack of blocks, an output layer."""

    def __init__(self, vocab: int, context: int, width: int = 64, layers: int = 4, heads: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(context, width) * 0.02)
        self.blocks = nn.Sequential(*(Block(width, heads, context) for _ in range(layers)))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens) + self.position[: tokens.shape[1]]))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
               targets: torch.Tensor) -> torch.Tensor:
    """One optimization step on one batch; returns the loss."""
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--context", type=int, default=1024)
    args = parser.parse_args()

    torch.manual_seed(0)
    dataset = PatternText(args.context)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = LongContextModel(dataset.vocab, args.context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        for step, (tokens, targets) in enumerate(loader):
            loss = train_step(model, optimizer, tokens, targets)
            print(f"epoch {epoch} step {step} loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
