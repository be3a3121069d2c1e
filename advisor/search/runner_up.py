"""The runner-up the best is confirmed against before a session ends (`ending.confirm_best`): the fastest other
setting that may still be the faster, given the noise of both figures and the draws between processes
(`draws`), and worth a trial by the search's own bar. Torch-free.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from advisor.search.record import SessionRecord, TrialRow
from advisor.search.applicable import in_effect
from advisor.search.budget import STOP_SHARE
from advisor.search.draws import between, session_spread
from advisor.search.drift import pair_changed
from advisor.search.expected import remeasure_value
from advisor.search.remeasures import run_folders, runs_of
from advisor.search.state import best_row
from advisor.search.strategy import knobs_key
from advisor.search.trial_runner import measure_record, measured, trial_record
from advisor.trials.record import TrialResult
from advisor.trials.record.measurement import noise


def worth_confirming(lead: float, noise: float, min_gain: float) -> bool:
    """Whether a setting `lead` ahead of the best (negative: behind), with `noise` (two standard errors of the
    difference), is expected to improve on it by STOP_SHARE of the least gain worth keeping, the search's own bar."""
    return remeasure_value(lead, noise) >= STOP_SHARE * min_gain


def contender(out: Path, state: SessionRecord, best: TrialResult,
              min_gain: float) -> tuple[TrialRow, list[Path]] | None:
    """The runner-up to confirm the best against, and the folders of its runs: of the other settings, fastest
    first, the first that may still be the faster (within the noise, and `worth_confirming`), or measured across
    a change of the machine's load; None where every one is clearly behind. Never a change that was not applicable (it
    measured a setting already run, not another one). The fastest other is not always the one: a change kept
    beyond its noise by a hair (batch 64 at +10.8 %, noise 10.0 %) leaves the setting it was kept over within the
    noise, while a slower but steadier setting between the two reads clearly behind. Each was measured in processes
    of its own, so the noise of their difference holds the draws between processes (`draws`) beside their windows'."""
    top = best_row(state)
    best_measure, best_folders = measured(out, state, best), run_folders(out, state, top)
    draws = session_spread(out, state)
    fastest: dict[tuple, dict[str, Any]] = {}
    for t in state.trials:
        key = knobs_key(in_effect(t))
        if (t.status == "ok" and t.samples_per_s and t.decision != "not applicable"
                and key != knobs_key(in_effect(top))
                and (key not in fastest or t.samples_per_s > fastest[key].samples_per_s)):
            fastest[key] = t
    rows = {t.name: t for t in state.trials}
    top_key = knobs_key(in_effect(top))
    # The best's setting by its fastest run too, as every other setting is: a re-measure of it under a load reads
    # slower than the baseline, which then led the ranking.
    top_sps = max((t.samples_per_s for t in state.trials if t.status == "ok" and t.samples_per_s
                   and knobs_key(in_effect(t)) == top_key), default=top.samples_per_s)

    def lead(t: TrialRow) -> float:
        # Against the best's own setting, the gain decided beside it (at one load) says more than samples/s
        # measured at loads of their own; other rows are compared by their figures.
        base = rows.get(t.get("base") or "")
        if base is not None and knobs_key(in_effect(base)) == top_key and t.gain is not None:
            return t.gain
        return t.samples_per_s / top_sps - 1 if top_sps else 0.0
    for rank, row in enumerate(sorted(fastest.values(), key=lambda t: -lead(t))):
        earlier = run_folders(out, state, row)
        row_measure = measure_record([trial_record(f) for f in earlier])
        # The fastest other is confirmed too where its runs and the best's span a change of load (a slower one
        # then is no closer call than the fastest).
        if rank == 0 and pair_changed(runs_of(out, state, top.knobs), runs_of(out, state, row.knobs)):
            return row, earlier
        spread = math.hypot(noise(best_measure, row_measure), between(draws, len(best_folders), len(earlier)))
        ahead = row_measure.samples_per_s / best_measure.samples_per_s - 1
        if ahead >= -spread and worth_confirming(ahead, spread, min_gain):
            return row, earlier
    return None
