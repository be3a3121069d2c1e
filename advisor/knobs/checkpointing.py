"""`checkpointing`: the model's repeated blocks under activation checkpointing (non-reentrant).

- **In the trial**: at the model's first call, each of its repeated blocks (the outermost module class it
  holds two or more of, with layers of its own: a transformer's `Block`s, the `checkpoint_candidates` of the
  memory record) runs under `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`: what it saved for
  backward is recomputed there instead (about one more forward of the blocks), with the forward's RNG state
  (dropout draws the same masks: the same loss and gradients); always with the batch it buys.
- **Proposed when**: memory binds:
    - the user's batch ran out of memory (after AMP, before micro-batches: the one way to keep the batch, and
      with `--keep-effective-batch` the batch asked for);
    - or the larger batch the search wants does not fit (the memory model puts it over GPU memory, RAM or
      `--memory-limit`, or it ran out of memory): checkpointing and that batch as one change, kept only where
      faster than the best without it.
- **Not applicable**: a model that repeats no block with layers of its own.
- **The patch writes**: in the `forward` that loops over the blocks, `x = block(x)` becomes
  `x = checkpoint(block, x, use_reentrant=False)` (an `nn.Sequential` call: `checkpoint_sequential`); where
  no such call is found, a note says what to change.
"""

from advisor.knobs.knob import AT_FIRST_CALL, FLAG, FROM_TRIAL, MEMORY, Knob, Written

KNOB = Knob("checkpointing", FLAG, MEMORY, AT_FIRST_CALL, "activation checkpointing", in_process=True,
            on_surface=False, written=Written(FROM_TRIAL, record="checkpoint_plan"))
