"""The user's say over the search: `--only KNOBS`, `--skip KNOBS` and `--try KNOB[=VALUE]`.

`--only` and `--skip` bound the search space: a proposal that would turn a knob outside it is not made
(a change of two knobs, such as pinned memory with non_blocking copies or workers with fewer threads,
keeps the part the user allows). `--try` settings run as trials right after the baseline, on top of the
best so far, and are decided like any other change. The names are the `Knobs` fields (docs/knobs.md,
a section each): one clear error for a name that is not one, listing those that are. Torch-free.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable

from advisor.search.record import SessionRecord
from advisor.errors import AdvisorError
from advisor.search.proposal import Proposal, on_best, own_moves
from advisor.search.strategy import SearchSpace
from advisor.knobs import BY_NAME, COMPANIONS, SWITCHED_KNOBS, TURNED, with_companions
from advisor.trials.knobs import Knobs

TRY = "try"  # the recommendation id of a trial the user asked for with --try
# Knobs that go with another are never turned alone by the search (workers persist with their count).
KNOB_NAMES = TURNED


def _unknown(flag: str, name: str) -> AdvisorError:
    return AdvisorError(f"{flag}: unknown knob {name!r} (known: {', '.join(KNOB_NAMES)})")


def knob_names(values: Iterable[str], flag: str) -> tuple[str, ...]:
    """Knob names from `--only`/`--skip` values (each comma-separated, repeatable), checked, in order."""
    names: list[str] = []
    for value in values:
        for name in (n.strip() for n in str(value).split(",")):
            if not name:
                continue
            if name not in KNOB_NAMES:
                raise _unknown(flag, name)
            if name not in names:
                names.append(name)
    return tuple(names)


def _value(name: str, text: str | None) -> Any:
    """One knob's value as `--try` gives it: a flag alone is true, `amp` alone is bf16 (each knob's `parse`)."""
    try:
        return BY_NAME[name].parse(text)
    except ValueError as exc:
        raise AdvisorError(f"--try: {exc}") from None


def try_settings(text: str) -> dict[str, Any]:
    """The knobs one `--try` sets: `uint8_copies`, `batch_size=128`, or several at once,
    `amp=bf16,channels_last` (one trial); checked as `Knobs` checks them."""
    values: dict[str, Any] = {}
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        name, has_value, value = part.partition("=")
        name = name.strip()
        if name not in KNOB_NAMES:
            raise _unknown("--try", name)
        values[name] = _value(name, value if has_value else None)
    if not values:
        raise AdvisorError(f"--try: no knob in {text!r}; give KNOB or KNOB=VALUE")
    values = with_companions(values)  # as the search sets workers: they live across epochs
    try:
        Knobs(**values)
    except ValueError as exc:
        raise AdvisorError(f"--try {text}: {exc}") from None
    return values


def check_steering(only: tuple[str, ...] | None, skip: tuple[str, ...], tries: tuple[str, ...]) -> None:
    """The three options together, before anything runs: one line naming what contradicts what."""
    both = sorted(set(only or ()) & set(skip))
    if both:
        raise AdvisorError(f"--only and --skip both name {', '.join(both)}")
    for text in tries:
        skipped = sorted(set(try_settings(text)) & set(skip))
        if skipped:
            raise AdvisorError(f"--try {text}: {', '.join(skipped)} is also in --skip")


def in_process_tries(tries: tuple[str, ...], model_knobs: tuple[str, ...]) -> None:
    """`tune()` runs trials in the notebook's process: a try of a model knob it cannot apply there (a compile
    leaves dynamo's caches behind; the optimizer and Dataset are built already) is refused in one line."""
    for text in tries:
        out = sorted(k for k in try_settings(text) if k in SWITCHED_KNOBS and k not in model_knobs)
        if out:
            raise AdvisorError(f"tries: {', '.join(out)} cannot be tried in the notebook's process "
                               f"(its model knobs: {', '.join(model_knobs)})")


def user_space(space: SearchSpace, only: Iterable[str] | None, skip: Iterable[str]) -> SearchSpace:
    """The search space bounded by the user's --only and --skip (the space's own bounds kept)."""
    return dataclasses.replace(space, only=None if only is None else frozenset(only), skip=frozenset(skip))


def pending_try(options: Any, state: SessionRecord, best: Knobs, diagnosis: Any = None) -> Proposal | None:
    """The next `--try` setting not yet run in this session, as a proposal on top of the best knobs, with the
    gain the best trial's advice gives those knobs (0 where none advises them; the policy prices it by the model
    where the model can simulate it, as the search's own); None when all have run."""
    done = {t.change for t in state.trials if t.recommendation == TRY}
    for text in options.tries:
        change = f"--try {text}"
        if change in done:
            continue
        values = try_settings(text)
        own = own_moves(values, best, state.user_values or {})
        if own and own == {k: v for k, v in values.items() if k not in COMPANIONS}:
            note = f"{change}: not run, the script has it already ({own_text(own, state)})"
            if note not in state.notes:
                state.notes.append(note)
            continue
        values = {k: v for k, v in values.items() if k not in own}
        advised = [r for r in getattr(diagnosis, "recommendations", ()) if set(r.knobs) & set(values)]
        return on_best(best, values, TRY, change, "try-" + Knobs(**values).label(),
                       sum(r.predicted_gain for r in advised), None, False,
                       why="asked for with --try",
                       predicted=bool(advised))
    return None


def own_text(knobs: dict[str, Any] | Any, state: SessionRecord) -> str:
    """The script's own settings of these knobs as the baseline row says them: "bf16 autocast, train.py line 84"."""
    own = state.get("own_settings") or {}
    parts = []
    for knob in knobs:
        setting = own.get(knob)
        if setting is None:
            parts.append(f"{knob}={(state.user_values or {}).get(knob)!r}")
            continue
        site = setting.site
        where = ""
        if isinstance(site, str) and site.rpartition(":")[2].isdigit():
            path, _, line = site.rpartition(":")
            where = f", {os.path.basename(path)} line {line}"
        parts.append(f"{setting.what or knob}{where}")
    return "; ".join(parts)
