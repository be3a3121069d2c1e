"""--time-budget is the whole session's, its end included: the search stops where the next trial and the trials kept
for the end would not fit, and the end runs what the time left holds. On replays (their trials' simulated time is
the session's clock, so the figures do not depend on this machine) and on a recorded live session's trials."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from advisor.search.budget import end_cut_short, trials_in_time, trials_left
from advisor.search.cost import answer_seconds, trial_seconds
from advisor.search.session import run_session
from advisor.search.record import typed
from advisor.search.state import SessionOptions
from advisor.search.strategy import surface_space
from advisor.trials.replay.surface import ReplayRunner, load_surface
from conftest import ROOT, SURFACES

SURFACE = SURFACES / "h200-conv-classifier"
LIVE = ROOT / "sample_runs" / "conv_classifier"  # a real CPU session: its trials' times are the machine's


def replay(out: Path, budget: float | None) -> dict:
    points = load_surface(SURFACE)
    return run_session(f"{SURFACE}:replay", out, SessionOptions(time_budget_s=budget), log=lambda m: None,
                       runner=ReplayRunner(points, out, 0.05, 1), script=False, space=surface_space(points),
                       extra={"replay": str(SURFACE)}, outputs=False)


@pytest.fixture(scope="module")
def unbounded(tmp_path_factory) -> dict:
    return replay(tmp_path_factory.mktemp("unbounded"), None)


@pytest.mark.parametrize("share", [0.5, 0.75])
def test_a_time_budget_holds_the_whole_session_and_keeps_time_for_the_end(tmp_path, unbounded, share):
    budget = share * unbounded["time"]["wall_s"]
    state = replay(tmp_path, budget)
    assert state["time"]["simulated"] and state["time"]["wall_s"] <= budget  # the end included
    stopped = next(n for n in state["notes"] if n.startswith("stopped"))
    assert stopped.startswith(f"stopped: the time budget of {budget:g} s (--time-budget) holds no more trials beside "
                              "the 3 kept for the end")
    # The end ran in the time kept for it: the best measured again (confirmed, or beside the baseline).
    assert any(t["recommendation"] == "confirm" for t in state["trials"])
    assert len(state["trials"]) < len(unbounded["trials"])
    assert state["speedup"] and state["best"] != state["baseline"]


def test_without_a_time_budget_the_time_never_stops_the_search(unbounded):
    assert not any("--time-budget" in n for n in unbounded["notes"])
    assert trials_in_time(LIVE, json.loads((LIVE / "session.json").read_text()), SessionOptions(), None) == math.inf


def test_a_live_sessions_budget_counts_its_clock_and_its_trials_time():
    state = typed(json.loads((LIVE / "session.json").read_text()))
    per = trial_seconds(LIVE, state)
    recorded = state["time"]["wall_s"]
    options = SessionOptions(time_budget_s=recorded + 3 * per, max_trials=len(state["trials"]) + 10)
    # Started just now: the trials' recorded time is what was spent; three trials' time is left.
    assert trials_in_time(LIVE, state, options, time.monotonic()) == pytest.approx(3, abs=0.05)
    assert trials_left(LIVE, state, options, time.monotonic()) == 3
    # Started longer ago than the trials took (the clock ran on between them): the clock's time counts, and only
    # whole trials are left (a round of two in turns took 1.6 trials' time on the demo: a part would overrun).
    assert trials_left(LIVE, state, options, time.monotonic() - recorded - 2.5 * per) == 0
    assert trials_left(LIVE, state, options, time.monotonic() - recorded - 1.5 * per) == 1
    # The progress line's time to the answer: no more than the budget leaves after the trial running now.
    assert answer_seconds(LIVE, state, options.max_trials, 1, options.time_budget_s) == pytest.approx(2 * per, rel=0.01)
    assert answer_seconds(LIVE, state, options.max_trials, 1) == pytest.approx(9 * per)


def test_an_end_the_time_budget_cut_short_is_said_and_only_then():
    state = typed(json.loads((LIVE / "session.json").read_text()))
    per, recorded, n = trial_seconds(LIVE, state), state["time"]["wall_s"], len(state["trials"])
    now = time.monotonic()
    short = SessionOptions(time_budget_s=recorded + 1.5 * per, max_trials=n + 10)
    note = end_cut_short(LIVE, state, short, now)
    assert note.startswith(f"the time budget (--time-budget {short.time_budget_s:g} s) left {1.5 * per:.0f} s for the "
                           f"end, less than the 2 trials (about {2 * per:.0f} s) that measure the best again")
    assert end_cut_short(LIVE, state, SessionOptions(time_budget_s=recorded + 3 * per, max_trials=n + 10), now) is None
    # The trials ran out, not the time: the trial count says so already.
    assert end_cut_short(LIVE, state, SessionOptions(time_budget_s=short.time_budget_s, max_trials=n + 1), now) is None
    assert end_cut_short(LIVE, state, SessionOptions(max_trials=n + 10), now) is None
