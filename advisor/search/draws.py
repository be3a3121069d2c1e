"""How far a setting's level moves from one trial process to the next, beyond its windows' own noise.

A trial's windows give its figure's standard error within its process. Built again in another process, the same
setting runs at a level of its own (where its buffers land in memory, which cores its threads get), so two settings
measured in processes of their own also differ by those draws, which no trial's windows show. On the CPU truth
surfaces (`tests/data/surfaces/cpu-*`, every setting measured in three processes, in shuffled order on a shared
machine) that spread, beyond the windows' own, is 1.9-6.7 % (`PRIOR`: their median, by `process_spread`). The
knob-grid bench's conv session kept batch 128 at +3.2 % (its windows' noise 2.5 %) on a trial that read 1579
samples/s; the same setting read 1197 measured again.

The session's settings measured in more than one process estimate it: each two runs of a setting measured alike give
half their squared log-ratio less their windows' own variance; `PRIOR` stands for `PRIOR_PAIRS` such pairs until
they do. Alike: alone, or windows in turns with another trial (the speedup's pairs), never one of each. A window
taken after waiting for the other's turn runs at a level of its own (the demo's baseline: 195 samples/s alone,
126 in turns; its best 341 and 227): a run of each way read that offset as a draw, 21 % between processes where
the surfaces give 2-7 %, and a user was told one run of each script reads within ±74 % of the claim.
Torch-free.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from advisor.search.record import SessionRecord, TrialRow
from advisor.search.applicable import in_effect
from advisor.search.strategy import knobs_key
from advisor.search.trial_runner import measure_record, trial_record
from advisor.trials.record.measurement import Measurement

PRIOR = 0.055  # the CPU truth surfaces' median spread between processes, beyond the windows' (tests check it)
PRIOR_PAIRS = 2  # the prior counts as this many pairs of runs of one setting


def process_spread(runs_by_setting: list[list[Measurement]], prior_pairs: int = PRIOR_PAIRS) -> float:
    """The relative spread of a setting's level between processes: `PRIOR` (as `prior_pairs` pairs of runs), moved
    by each setting's runs (one measurement a process) where there are two or more."""
    total, count = PRIOR ** 2 * prior_pairs, prior_pairs
    for runs in runs_by_setting:
        for a, b in zip(runs, runs[1:]):
            if a.samples_per_s and b.samples_per_s:
                within = (a.relative_se or 0.0) ** 2 + (b.relative_se or 0.0) ** 2
                total += max(0.0, math.log(a.samples_per_s / b.samples_per_s) ** 2 - within) / 2
                count += 1
    return math.sqrt(total / count) if count else PRIOR


def session_runs(out: Path, state: SessionRecord) -> dict[tuple[tuple, bool], list[Measurement]]:
    """Each setting's runs in the session (a measurement a trial that measured: one process each), by the setting
    and whether its windows ran in turns with another trial's."""
    runs: dict[tuple[tuple, bool], list[Measurement]] = {}
    for t in state.trials:
        if t.status == "ok" and t.samples_per_s and t.folder:
            record = trial_record(out / t.folder)
            in_turns = bool((record.get("schedule") or {}).get("turns"))
            runs.setdefault((knobs_key(in_effect(t)), in_turns), []).append(measure_record([record]))
    return runs


def session_spread(out: Path, state: SessionRecord) -> float:
    """`process_spread` from the session's own runs: each trial that measured is one process of its setting, and
    only runs measured alike are set against each other (`session_runs`)."""
    return process_spread(list(session_runs(out, state).values()))


def measured_spread(state: SessionRecord, run: Any) -> float:
    """The draws between the runner's processes where they were measured: what the runner says of its own (a replay
    serves them, or none: `TrialRunner.process_draws`); else `PRIOR` on the CPU (the CPU truth surfaces) and 0 on
    another device, whose draws this project has not measured. Not the session's own runs: a setting run again
    after the load changed reads the load's change as a draw (a replay under a drifting load read 38 %)."""
    if getattr(run, "process_draws", None) is not None:
        return run.process_draws
    return PRIOR if ((state.device or {}).get("type") or "cpu") == "cpu" else 0.0


def between(spread: float, a_runs: int, b_runs: int) -> float:
    """What the draws add to the noise of the difference of two settings pooled over `a_runs` and `b_runs`
    processes: two standard errors, as `measurement.noise` gives the windows'."""
    return 2 * spread * math.sqrt(1 / max(1, a_runs) + 1 / max(1, b_runs))


def run_to_run_width(spread: float, base_runs: int, best_runs: int) -> float:
    """Within ± this share of a speedup read from `base_runs` and `best_runs` processes of the two settings, one
    run of each reads about 95 % of the time: their own two draws, and the claim's (on the CPU truth surfaces,
    88-92 % of such pairs fell inside, the draws' tails being heavier than a normal's)."""
    return 2 * spread * math.sqrt(2 + 1 / max(1, base_runs) + 1 / max(1, best_runs))


# One more pair of the speedup's processes (a run of each setting) is worth its time only where it narrows the width
# a user's own one-run check reads by at least this share: the conv example's third pair narrowed it by 3 % (from
# three runs of each to four) for 11 s of an 87 s session.
NARROWING = 0.05


def pair_narrowing(base_runs: int, best_runs: int) -> float:
    """The share by which one more run of each setting narrows `run_to_run_width` (whatever the spread)."""
    return 1 - run_to_run_width(1.0, base_runs + 1, best_runs + 1) / run_to_run_width(1.0, base_runs, best_runs)


def run_counts(runs: dict[tuple[tuple, bool], list[Measurement]], rows: tuple[TrialRow, ...]) -> list[int]:
    """How many processes of each row's setting measured (`session_runs`), at least 1 each."""
    return [sum(len(r) for (key, _), r in runs.items() if key == knobs_key(in_effect(row))) or 1 for row in rows]


def run_to_run_note(out: Path, state: SessionRecord, reference: TrialRow, best: TrialRow) -> str:
    """What a user timing one run of the patched script against one of the original may read beside the claimed
    speedup: each of their two runs is a draw of its setting's level, as each of the session's runs was."""
    runs = session_runs(out, state)
    spread = process_spread(list(runs.values()))
    counts = run_counts(runs, (reference, best))
    width = run_to_run_width(spread, *counts)
    learnt = any(len(r) > 1 for r in runs.values())
    source = ("this session's settings measured more than once, beside the CPU truth surfaces' figure" if learnt
              else "the CPU truth surfaces, where each setting ran in three processes")
    return (f"Each run builds its settings at a level of its own: {100 * spread:.1f} % apart from one process to "
            f"the next ({source}). One run of the patched script timed against one run of the original reads "
            f"within about ±{100 * width:.0f} % of ×{state.speedup:.2f} (95 %), the claim resting on "
            f"{counts[0]} and {counts[1]} run(s) of the two.")

