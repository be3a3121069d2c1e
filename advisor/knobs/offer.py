"""What a knob offers the search from the best of now: `Offer`, a move with the finding it answers, made from a
`Best` (the best's settings, what its trace advises, and what the session has `Learned` so far).

A knob whose module defines `offer(best)` is proposed by the search wherever that returns a move, or several (a
ladder's next step and its top): `advisor.search.strategy` turns each into a proposal on the best, ranks it by
expected improvement with every other candidate, and keeps or reverts it by the same rules. A ladder (the workers,
the batch) reads the session's history from `Best.learned`: the steps it took from these settings, the values that
failed or read within their noise. The knobs one finding's advice turns on (`Knob.advice`) are the strategy's own.
Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROUND_GAIN = 0.02  # what a change no rule advises is ranked at: a measured experiment, tried last


@dataclass(frozen=True)
class Learned:
    """What the session has measured so far, as a knob's offer reads it: its trial rows
    (`advisor.search.record.TrialRow`), the script's own settings, and its training loader's facts."""

    trials: tuple[Any, ...] = ()
    user: dict[str, Any] = field(default_factory=dict)
    loader: dict[str, Any] = field(default_factory=dict)

    def row(self, name: str | None) -> Any:
        """The trial row of this name (None where none)."""
        return next((t for t in self.trials if t.name == name), None)

    def within_noise(self, knobs: Any, knob: str) -> dict[Any, str]:
        """The values of `knob` measured on these settings otherwise and reverted, but not clearly slower (the
        change within its noise): value → what it read."""
        others = _all_but(knobs.to_dict(), knob)
        return {t.knobs.get(knob): f"read {100 * t.gain:+.0f}%, within its noise" for t in self.trials
                if t.status == "ok" and t.decision == "reverted" and t.gain is not None and t.noise is not None
                and t.gain > -t.noise and t.knobs and "+" not in str(t.recommendation)
                and _all_but(t.knobs, knob) == others}

    def failed(self, knobs: Any, knob: str) -> dict[Any, str]:
        """The values of `knob` whose trial, on these settings otherwise, failed other than out of memory: value →
        why."""
        others = _all_but(knobs.to_dict(), knob)
        return {t.knobs.get(knob): (t.message or t.status) for t in self.trials
                if t.status not in ("ok", "oom") and t.knobs and _all_but(t.knobs, knob) == others}

    def steps_from(self, knobs: Any, change: str, bound: str | None, moved: tuple[str, ...]) -> list[dict[str, Any]]:
        """The settings of the trials that made this change (a ladder's step) under this bound from these settings
        (all but the knobs `moved` equal)."""
        base = _all_but(knobs.to_dict(), *moved)
        return [t.knobs for t in self.trials if t.recommendation == change
                and t.get("tried_under") == bound and _all_but(t.knobs, *moved) == base]


def _all_but(knobs: dict[str, Any], *names: str) -> dict[str, Any]:
    """The settings other than these knobs (a companion goes with its knob: persistent_workers with the workers)."""
    from advisor.knobs import COMPANIONS  # the registry imports the knob modules, which import this one
    return {k: v for k, v in knobs.items() if k not in names and k not in COMPANIONS}


@dataclass(frozen=True)
class Best:
    """The best of now as a knob's offer reads it."""

    knobs: Any  # its settings, one attribute a knob (`advisor.trials.knobs.Knobs`)
    advice: dict[str, Any]  # its trace's recommendations by finding id (predicted_gain, knobs, bound, recoverable)
    bound: str | None  # what bounds its step ("input", "copy", "compute", ...)
    device: dict[str, Any]  # the session's device facts (type, gpu)
    cores: int  # the CPU cores one rank has
    workers: int  # DataLoader workers in effect (set, or the script's)
    threads: int | None  # torch threads in effect (set, or the script's)
    space: Any  # the values the search may give (`SearchSpace`: values, holds, allows, permits)
    ranks: int  # processes per node
    learned: Learned = Learned()  # what the session measured so far
    name: str | None = None  # its trial's name
    batch: int | None = None  # the batch its trial measured (None: measured in steps)
    options: Any = None  # the session's options (keep_effective_batch, memory_safety)

    @classmethod
    def of(cls, knobs: Any, advice: dict[str, Any], bound: str | None, device: dict[str, Any], cores: int,
           space: Any, ranks: int, learned: Learned, trial: Any = None, options: Any = None) -> Best:
        """The best of a session (`trial`: its trial, with its name and the batch it measured; None: not run yet):
        its workers and threads those it sets, else the script's own."""
        workers = knobs.num_workers if knobs.num_workers is not None else learned.user.get("num_workers")
        return cls(knobs, advice, bound, device, cores, workers or 0, knobs.threads or learned.user.get("threads"),
                   space, ranks, learned, getattr(trial, "name", None), getattr(trial, "batch_size", None), options)

    @property
    def accelerator(self) -> bool:
        """Whether the trials run on CUDA."""
        return self.device.get("type") == "cuda"


@dataclass(frozen=True)
class Offer:
    """A move a knob offers: its moves (knob → value), how it reads, its folder's slug, the gain its advice
    predicts (else its place in the round), the bound it addresses, whether that gain is a prediction, the id
    of the change it is proposed as (None: the knob's `proposed_as`), why it is tried where the bound does not say
    (a ladder's step past one that failed), and the share of the step the trace says it can take back at most."""

    moves: dict[str, Any]
    change: str
    slug: str
    gain: float
    bound: str | None
    predicted: bool = True
    recommendation: str | None = None
    why: str | None = None
    recoverable: float | None = None
