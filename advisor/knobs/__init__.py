"""The registry of knobs: one module a knob (its `Knob` and its reference text), gathered here in order.

The order is the order of `Knobs`' fields, of a trial's folder name (`amp-bf16+num-workers-2`) and of the
knobs in trial.json. Everything that iterates over the knobs reads this registry: `Knobs`
(`advisor.trials.knobs`), the record's shapes (`advisor.shapes`), `--only`/`--skip`/`--try`
(`advisor.search.space`), the recorded surfaces (`advisor.trials.replay.surface`), the frameworks'
fields, the search's companions and orders, the trial's reading of the script's own settings, the what-if model's
transformations and priors (`advisor.analysis.whatif`), the patch (`advisor.code.patch`: where each knob is written, `written_at`), a change's
words (`moves_text`), the report's notes beside lint findings, the trial's time limit, and the documentation's knob
page. Adding a knob: a module beside these and its line
below (docs/architecture/index.md, "A new knob"). Stdlib only.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from advisor.knobs.knob import AT_DATASET, CHOICE, COUNT, DATA, DDP, FLAG, LOADER, MEMORY, MODEL, WORKERS, Knob, WhatIf

NAMES = ("amp", "batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "non_blocking",
         "accumulation_steps", "threads", "channels_last", "compile", "fused_optimizer", "tf32", "cudnn_benchmark",
         "sdpa", "uint8_copies", "checkpointing", "ddp_bucket_cap_mb", "ddp_gradient_as_bucket_view",
         "ddp_static_graph", "ddp_find_unused_parameters")
KNOBS: tuple[Knob, ...] = tuple(import_module(f"{__name__}.{name}").KNOB for name in NAMES)
BY_NAME = {knob.name: knob for knob in KNOBS}


def of_part(*parts: str) -> tuple[str, ...]:
    """The names of the knobs of these parts (`LOADER`, `MODEL`, ...), in the registry's order."""
    return tuple(k.name for k in KNOBS if k.part in parts)


def applied_at(where: str) -> tuple[str, ...]:
    """The names of the knobs a trial applies at this point (`AT_FIRST_CALL`, ...), in the registry's order."""
    return tuple(k.name for k in KNOBS if k.applied == where)


def written_at(*places: str) -> tuple[Knob, ...]:
    """The knobs the patch writes at these places (`IN_LOADER`, `AFTER_IMPORTS`, ...), in the registry's order."""
    return tuple(k for k in KNOBS if k.written and k.written.at in places)


DATALOADER_KNOBS = of_part(LOADER)
MODEL_KNOBS = of_part(MODEL)  # how the model runs: taken off again where their place is in doubt
SWITCHED_KNOBS = of_part(MODEL, DATA)  # turned on where a surface holds both sides of them
MEMORY_KNOBS = of_part(MEMORY)  # buy memory, not speed: proposed where memory binds
DDP_KNOBS = of_part(DDP)
TORCH_SETTINGS = tuple(k for k in KNOBS if k.setting)  # process-wide torch settings: applied, read, written alike
IN_PROCESS_KNOBS = tuple(k.name for k in KNOBS if k.in_process)  # what `advisor.tune()` applies in its process
COMPANIONS = frozenset(k.name for k in KNOBS if k.companion_of)  # go with another knob, never turned alone
TURNED = tuple(k.name for k in KNOBS if not k.companion_of)  # what --only, --skip and --try name
ORDERED = frozenset(k.name for k in KNOBS if k.kind in (COUNT, WORKERS))  # a larger value is a move one way
NEEDS_WORKERS = tuple(k for k in KNOBS if k.needs_workers)  # DataLoader rejects them without worker processes
WORKER_COUNT = next(k.name for k in KNOBS if k.kind == WORKERS)  # the loader's worker count, which those need
PLANNED_AT_LOADER = tuple(k for k in KNOBS if k.in_loader)  # the training DataLoader's arguments plan them in turn
# Whose outcome the training loader decides: its arguments, its micro-batches, its Dataset's images.
DECIDED_AT_LOADER = tuple(k.name for k in KNOBS if k.in_loader or k.applied == AT_DATASET)
# Each offers the search its own move from the best (`knobs.offer`), the ladders first.
OFFERING = tuple(sorted((k for k in KNOBS if k.offer), key=lambda k: k.order))
STARTING = tuple(k for k in KNOBS if k.at_steps_start)  # applied by the trial once the steps start (`at_steps_start`)
COMPILING = tuple(k.name for k in KNOBS if k.compiles)


def compiled(knobs: Any) -> bool:
    """Whether these settings (`Knobs`) compile the step."""
    return any(getattr(knobs, name) for name in COMPILING)


# Each offers its moves to the recovery plan of a baseline that ran out of memory (`Knob.recover`), in the plan's
# order.
RECOVERING = tuple(sorted((k for k in KNOBS if k.recover), key=lambda k: k.recovers_at))
# Knobs that change how batches reach the step, not what it computes.
NEUTRAL = frozenset(k.name for k in KNOBS if not k.numerics)


def with_companions(moves: dict[str, Any]) -> dict[str, Any]:
    """The moves with the knobs that go with them (more workers persist across epochs)."""
    return {**moves, **{k.name: k.companion_of[1] for k in KNOBS
                        if k.companion_of and moves.get(k.companion_of[0]) and k.name not in moves}}


def companions_of(knobs: Any) -> set[str]:
    """The knobs that go with these (by name): persistent_workers with num_workers."""
    return {k.name for k in KNOBS if k.companion_of and k.companion_of[0] in knobs}


def without_lone_companions(moves: dict[str, Any]) -> dict[str, Any]:
    """The moves less a companion whose knob does not move with it."""
    return {k: v for k, v in moves.items() if k not in COMPANIONS or BY_NAME[k].companion_of[0] in moves}


COPY_KNOBS = tuple(k.name for k in KNOBS if k.copies)  # on host-to-device copies: nothing to measure on the CPU
LINT_FIXES = {k.lint: k.name for k in KNOBS if k.lint}  # an `advisor lint` rule → the knob its fix sets


def moves_text(moves: dict[str, Any]) -> str:
    """Moves in words ("workers →8 + batch →64"): knobs that read as one change together in its words, a
    companion left to its knob."""
    joined = [k for k in KNOBS if k.together and moves.get(k.name) and moves.get(k.together[0])]
    covered = {name for k in joined for name in (k.name, k.together[0])}
    return " + ".join([k.together[1] for k in joined] + [BY_NAME[name].move_text(value) for name, value in moves.items()
                                                          if name not in COMPANIONS and name not in covered])


ADVISED = tuple(k for k in KNOBS if k.advice)  # turned on where a finding of the trace advises them


def advised_by(advice: str) -> dict[str, bool]:
    """The knobs a finding's advice turns on (its `Recommendation.knobs`), by the finding's id."""
    return {k.name: True for k in KNOBS if k.advice == advice}


def advised_values(change: str, figures: dict[str, Any]) -> dict[str, Any]:
    """The knobs a finding's change sets and their values, chosen from the finding's figures by each knob proposed as
    that change (`Knob.advised`), in the registry's order."""
    chosen = ((k.name, k.advised(figures)) for k in KNOBS if k.proposed_as == change and k.advised)
    return {name: value for name, value in chosen if value is not None}


def proposed_knobs(change: str, value: Any = True) -> dict[str, Any]:
    """The knobs a finding's change turns where the search proposes them by a move of its own (their
    `proposed_as`, the finding's id), each at `value` ("increase": up their ladder); its `Recommendation.knobs`."""
    return {k.name: value for k in KNOBS if k.proposed_as == change}


# The what-if model's part of each knob it transforms (`Knob.whatif`, `advisor.analysis.whatif`): by the knob's
# name, by the model's name for the change (pin_memory and non_blocking make one, "pinned"), and the
# transformations once each, in the registry's order.
MODELLED = {k.name: k.whatif for k in KNOBS if k.whatif}
TRANSFORMATIONS = tuple({w.term: w for w in MODELLED.values()}.values())
WHAT_IFS = {**MODELLED, **{w.term: w for w in TRANSFORMATIONS}}


def making(term: str) -> tuple[str, ...]:
    """The knobs whose settings together make the model's change `term` (pinned: pin_memory and non_blocking)."""
    return tuple(name for name, w in MODELLED.items() if w.term == term)


# knob -> the field of transformers' TrainingArguments that sets it
TRAINING_ARGUMENTS = {k.name: k.training_argument for k in KNOBS if k.training_argument}

__all__ = ["ADVISED", "BY_NAME", "CHOICE", "COMPANIONS", "COMPILING", "COUNT", "DATALOADER_KNOBS", "DDP_KNOBS",
           "DECIDED_AT_LOADER", "FLAG", "IN_PROCESS_KNOBS", "KNOBS", "MEMORY_KNOBS", "MODELLED", "MODEL_KNOBS",
           "NAMES", "NEEDS_WORKERS", "NEUTRAL", "OFFERING", "ORDERED", "PLANNED_AT_LOADER", "RECOVERING", "STARTING",
           "SWITCHED_KNOBS", "TORCH_SETTINGS", "TRAINING_ARGUMENTS", "TRANSFORMATIONS", "TURNED", "WHAT_IFS",
           "WORKERS", "WORKER_COUNT", "Knob", "WhatIf", "advised_by", "advised_values", "applied_at", "companions_of",
           "compiled", "making", "of_part", "with_companions", "without_lone_companions", "written_at"]
