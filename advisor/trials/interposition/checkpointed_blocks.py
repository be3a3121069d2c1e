"""The `checkpointing` knob: the model's repeated blocks run under activation checkpointing. Inside the
trial only (torch imported lazily).

At the model's first call (`advisor.trials.interposition.model` calls `checkpoint_blocks`) the blocks are the
instances of the outermost repeated module class with submodules of its own: the same rule
`advisor.trials.harness.activations` names its `checkpoint_candidates` by (a transformer's `Block`s, not the
`Linear`s or the `Sequential` inside each, nor an `nn.Sequential` that stacks them). Each block's forward becomes
`torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)` where autograd records (in
training; under `no_grad` it runs as it was): what the block saved for backward is freed after its forward and
recomputed in backward, with the RNG state of the forward (dropout draws the same masks). The module is not
replaced, so its hooks, its parameters and the optimizer's references stay as they were.

The plan the patch writes from (`CheckpointPlan`) is where the blocks sit: the class of the module that holds
them, its file, the attribute (`self.blocks`), and whether that is a list looped over or an `nn.Sequential`.
"""

from __future__ import annotations

from typing import Any

from advisor.knobs.in_trial import ModelChange, forwards_back
from advisor.trials.knobs import APPLIED, not_applicable

CONTAINERS = ("ModuleList", "ModuleDict")  # hold blocks but are never called: never the block


def repeated_blocks(model: Any) -> list[tuple[str, Any]]:
    """(qualified name, module) of the blocks to checkpoint: every instance of the repeated module classes
    with submodules, outermost only (none inside another block); [] where the model repeats none."""
    named = [(name, m) for name, m in model.named_modules() if name and type(m).__name__ not in CONTAINERS]
    # An nn.Sequential that stacks blocks (two or more children of one repeated class) holds them as a
    # ModuleList does: checkpointed whole, it would recompute every block at once and save nothing.
    repeated = repeated_classes(named)
    stacks = {id(m) for _, m in named if is_stack(m, repeated)}
    named = [(name, m) for name, m in named if id(m) not in stacks]
    repeated = repeated_classes(named)
    blocks: list[tuple[str, Any]] = []
    for name, m in named:
        if type(m) in repeated and not any(name.startswith(f"{outer}.") for outer, _ in blocks):
            blocks.append((name, m))
    return blocks


def repeated_classes(named: list[tuple[str, Any]]) -> set[type]:
    """The classes with submodules of their own that occur twice or more among `named`."""
    counts: dict[type, int] = {}
    for _, m in named:
        if next(m.children(), None) is not None:
            counts[type(m)] = counts.get(type(m), 0) + 1
    return {kind for kind, count in counts.items() if count >= 2}


def is_stack(module: Any, repeated: set[type]) -> bool:
    """An nn.Sequential with two or more children of one repeated class: a stack of blocks, not a block."""
    if type(module).__name__ != "Sequential":
        return False
    kinds = [type(child) for child in module.children() if type(child) in repeated]
    return any(kinds.count(kind) >= 2 for kind in set(kinds))


def checkpoint_plan(model: Any, blocks: list[tuple[str, Any]]) -> dict[str, Any] | None:
    """Where the blocks sit, for the patch: the module that holds them (its class and file) and the attribute."""
    import inspect

    import torch

    parents = {name.rpartition(".")[0] for name, _ in blocks}
    if len(parents) != 1:
        return None
    path = parents.pop()
    holder_path, _, attribute = path.rpartition(".")
    holder = model.get_submodule(holder_path) if holder_path else model
    container = model.get_submodule(path) if path else model  # path "": the blocks are the model's children
    try:
        source = inspect.getsourcefile(type(holder))
    except (TypeError, OSError):
        source = None
    return {"holder": type(holder).__name__, "file": source, "attribute": attribute,
            "how": "sequential" if isinstance(container, torch.nn.Sequential) else "loop",
            "block": type(blocks[0][1]).__name__, "count": len(blocks), "names": [n for n, _ in blocks][:8]}


class CheckpointBlocks(ModelChange):
    """The `checkpointing` knob's change of the model (`Knob.on_model`): activation checkpointing of the repeated
    blocks, applied at the model's first call; the blocks recorded for the patch (`checkpoint_plan`); `undo`
    restores them."""

    record_fields = ("checkpoint_plan",)

    def __init__(self) -> None:
        super().__init__()
        self.wrapped: list[tuple[Any, bool, Any]] = []  # (block, had its own forward, that forward)
        self.plan: dict[str, Any] | None = None

    def apply(self, torch: Any, model: Any, args: tuple = ()) -> None:
        """Wrap the forward of each repeated block of `model` in a non-reentrant checkpoint."""
        blocks = repeated_blocks(model)
        if not blocks:
            self.outcome = self.outcome or not_applicable(
                f"the model ({type(model).__name__}) has no repeated blocks with layers of their own to checkpoint")
            return
        for _, block in blocks:
            own = "forward" in block.__dict__
            previous = block.__dict__.get("forward")
            block.forward = checkpointed(block.forward)
            self.wrapped.append((block, own, previous))
        self.plan = checkpoint_plan(model, blocks)
        self.outcome = APPLIED

    def record(self) -> dict[str, Any]:
        return {"checkpoint_plan": self.plan}

    def undo(self, torch: Any = None) -> None:
        """Give every block its own forward back (an in-process trial's model is the user's)."""
        forwards_back(self.wrapped)
        self.wrapped = []


def checkpointed(forward: Any) -> Any:
    """`forward` run under a non-reentrant activation checkpoint wherever autograd records."""
    import torch
    from torch.utils.checkpoint import checkpoint

    def forward_checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return forward_checkpointed
