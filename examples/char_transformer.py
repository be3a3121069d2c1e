"""A small character-level transformer language model: compute-bound, gains from bf16 autocast.

The text is generated (a seeded grammar of short sentences), so nothing is downloaded. Almost all of a
step is matrix multiplication in the attention and feed-forward layers, which bf16 autocast speeds up
on CPUs with AMX/AVX512-BF16 and on GPUs with Tensor Cores.

    python examples/char_transformer.py                       # train standalone
    advisor profile examples/char_transformer.py:train_step   # profile its training step
"""

from __future__ import annotations

import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

SUBJECTS = ["the profiler", "a kernel", "the loader", "my model", "each worker", "the optimizer", "a tensor"]
VERBS = ["waits for", "copies", "records", "launches", "scales", "pins", "overlaps with", "computes"]
OBJECTS = ["the batch", "a trace", "every step", "the gradients", "host memory", "the device", "a matmul"]
ENDINGS = [".", "!", " again.", " twice.", " quickly.", " after warmup."]


def make_text(sentences: int = 6000, seed: int = 0) -> str:
    """A deterministic corpus of short sentences."""
    rng = random.Random(seed)
    return " ".join(
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(ENDINGS)}".capitalize()
        for _ in range(sentences)
    )


class CharWindows(Dataset):
    """Fixed-length windows of the text as (input, next-character target) pairs."""

    def __init__(self, text: str, context: int):
        self.vocab = sorted(set(text))
        self.data = torch.tensor([self.vocab.index(c) for c in text], dtype=torch.long)
        self.context = context

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.context

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.context
        chunk = self.data[start : start + self.context + 1]
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    """Pre-norm causal self-attention and a feed-forward layer."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, length, width))
        return x + self.ff(self.norm2(x))


class CharTransformer(nn.Module):
    """Embeddings, a stack of blocks, and a tied output layer."""

    def __init__(self, vocab: int, context: int, width: int = 256, layers: int = 4, heads: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        nn.init.normal_(self.embed.weight, std=0.02)  # small, since the output layer shares it
        self.position = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.T


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
               targets: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One optimization step on one batch; returns the loss."""
    tokens, targets = tokens.to(device), targets.to(device)
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--context", type=int, default=128)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = CharWindows(make_text(), args.context)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = CharTransformer(len(dataset.vocab), args.context).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for epoch in range(args.epochs):
        for step, (tokens, targets) in enumerate(loader):
            loss = train_step(model, optimizer, tokens, targets, device)
            if step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
