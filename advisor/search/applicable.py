"""Knobs a trial found not applicable (channels_last on a model without convolutions, a compile that failed):
the trial is never kept for them, never a base with them, and the patch never writes them. Torch-free."""

from __future__ import annotations

import dataclasses
from typing import Any

from advisor.search.record import SessionRecord, TrialRow
from advisor.search.proposal import Proposal
from advisor.search.state import best_row
from advisor.search.strategy import turned
from advisor.trials.record import TrialResult


def refused_knobs(outcomes: dict[str, str] | None, knobs: dict[str, Any]) -> dict[str, None]:
    """The knobs a trial set and found not applicable, as settings that leave the user's value."""
    return {k: None for k, v in (outcomes or {}).items()
            if str(v).startswith("not applicable") and knobs.get(k) is not None}

def in_effect(row: TrialRow) -> dict[str, Any]:
    """The knobs a trial's row ran with: those it found not applicable left at the user's value."""
    return {**row.knobs, **refused_knobs(row.get("outcomes"), row.knobs)}

def applied_only(result: TrialResult) -> TrialResult:
    """The trial as the base of what follows: a knob it found not applicable (a compile that failed beside
    a change that paid) is dropped, so the next trials do not carry it and the patch does not write it."""
    refused = refused_knobs(result.knob_outcomes, result.knobs.to_dict())
    return dataclasses.replace(result, knobs=dataclasses.replace(result.knobs, **refused)) if refused else result

def not_applicable(row: TrialRow, proposal: Proposal, state: SessionRecord) -> str | None:
    """Why the change could not be made at all (every knob it turns was not applicable), else None."""
    knobs = turned(best_row(state).knobs, proposal.knobs)
    outcomes = row.get("outcomes") or {}
    refused = [f"{k}: {outcomes[k].removeprefix('not applicable: ')}" for k in sorted(knobs)
               if str(outcomes.get(k, "")).startswith("not applicable")]
    if row.status != "ok" or not knobs or len(refused) < len(knobs):
        return None
    return "; ".join(refused)
