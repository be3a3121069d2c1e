"""A tiny GPT-2 built from a config (no download) trained with transformers' Trainer on random tokens: the
loop, the DataLoader and the step are the Trainer's (on accelerate); the script holds only the settings."""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--steps", type=int, default=400)
args = parser.parse_args()


class RandomTokens(torch.utils.data.Dataset):
    """Sequences of random token ids, the labels the inputs (a causal LM shifts them itself)."""

    def __init__(self, count: int, length: int, vocab: int):
        self.tokens = torch.randint(0, vocab, (count, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict:
        ids = self.tokens[index]
        return {"input_ids": ids, "labels": ids}


torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=64, vocab_size=512)
model = GPT2LMHeadModel(config)
training_args = TrainingArguments(
    output_dir="hf_out",
    per_device_train_batch_size=args.batch_size,
    max_steps=args.steps,
    learning_rate=3e-4,
    optim="adamw_torch",
    logging_steps=100,
    save_strategy="no",
    report_to="none",
    dataloader_num_workers=0,
)
trainer = Trainer(model=model, args=training_args, train_dataset=RandomTokens(2048, 32, config.vocab_size))
trainer.train()
