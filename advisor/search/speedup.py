"""The session's speedup, the best's samples/s over the baseline's, and the note that says how it was read:
their own figures, their windows at one load, or the kept changes' gains chained. Torch-free."""

from __future__ import annotations

from pathlib import Path

from advisor.search.record import SessionRecord, TrialRow
from advisor.search.drift import apart, chained, mean_load, steady
from advisor.search.remeasures import measured_at_one_load, runs_of
from advisor.search.state import best_row
from advisor.search.trial_runner import trial_record

SAME_SPEEDUP = 0.05  # the speedup at one load this close to the direct one: the direct one is said


def session_speedup(out: Path, state: SessionRecord, reference: TrialRow) -> tuple[float | None, str]:
    """The best's samples/s over the baseline's, and how it was had: "one load" (every run of the two, cut to
    their windows at the quietest load both ran AT_ONE_LOAD windows at), "direct" (their own figures: where no load
    is known, where they give the same within SAME_SPEEDUP, or where the two ran at one load in too few windows
    to cut), or "chained" (the product of the kept changes' gains, each measured beside the best of its
    time)."""
    best = best_row(state)
    if not best.samples_per_s or not reference.samples_per_s:
        return None, "direct"
    direct = best.samples_per_s / reference.samples_per_s
    pair = [trial_record(out / row.folder) for row in (best, reference)]
    levels = [mean_load(record) for record in pair]
    if None in levels:
        return direct, "direct"
    matched = measured_at_one_load(runs_of(out, state, best.knobs), runs_of(out, state, reference.knobs))
    fast, slow = (m.samples_per_s for m in matched) if matched else (None, None)
    if fast and slow:
        return (direct, "direct") if abs(fast / slow / direct - 1) <= SAME_SPEEDUP else (fast / slow, "one load")
    if all(steady(record) for record in pair) and not apart(*levels):
        return direct, "direct"
    return chained(state.trials), "chained"

def speedup_note(state: SessionRecord, reference: TrialRow, side_by_side: bool = False) -> str:
    """The note that says how the speedup was read: off runs of the baseline and the best made one right after
    the other at the end (`side_by_side`), or not off their own figures, and why."""
    how = {"one load": "from their windows at one load",
           "chained": "the product of the kept changes' gains, each measured beside the best of its time"}
    direct = best_row(state).samples_per_s / reference.samples_per_s
    if state.get("speedup_basis") == "in turns":
        pairs = state.get("speedup_pairs") or 1
        how_many = f" (in {pairs} pairs of processes)" if pairs > 1 else ""
        return (f"The baseline and the best were measured again side by side before the session ended{how_many}, "
                f"their windows in turns (one measuring while the other waited), at the quietest load both had run "
                f"at: the speedup ×{state.speedup:.2f} is read from those windows and every other run of the two "
                f"at that load (their first figures give ×{direct:.2f}).")
    if side_by_side:
        return (f"The baseline and the best were measured again one right after the other before the session "
                f"ended: the speedup ×{state.speedup:.2f} is read from every run of the two at one load, so it "
                f"does not depend on what the machine did in between (their first figures give ×{direct:.2f}).")
    return (f"The baseline and the best were measured while the machine's load differed: the speedup "
            f"×{state.speedup:.2f} is {how[state.speedup_basis]}; their own figures give ×{direct:.2f}.")
