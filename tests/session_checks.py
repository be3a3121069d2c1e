"""Checks on a finished session that hold on any machine: each decision follows from what its trial
measured (a busy or slow machine measures other numbers, but the session must still act on them)."""

from __future__ import annotations

import math


def assert_decisions_follow_measurements(state: dict) -> None:
    """Kept changes measured a gain beyond their noise; reverted ones did not; the speed-up is the best's."""
    min_gain = state["options"]["min_gain"]
    rows = state["trials"]
    assert rows[0]["decision"] in ("baseline", "failed")
    for row in rows[1:]:
        if row["decision"] == "measured":  # the baseline and the best again at the end, for the speedup
            assert row["recommendation"] == "confirm" and "for the speedup at one load" in row["reason"], row
            continue
        assert row["decision"] in ("kept", "reverted", "failed"), row
        if row["decision"] == "failed":
            assert row["status"] != "ok" or row["recommendation"].startswith("oom-"), row
        if row["decision"] == "kept" and row["gain"] is not None and str(row["recommendation"]).startswith("without-"):
            # A knob taken off (advisor.search.simplify): the simpler setting, unless it measured slower.
            assert row["gain"] >= -max(min_gain, row["noise"]), row
        elif row["decision"] == "kept" and row["gain"] is not None:
            # One standard error of evidence for a change that addresses the bound, two otherwise.
            assert row["gain"] > max(min_gain, row["noise"] / 2 if row.get("helps_now") else row["noise"]), row
        if row["decision"] == "reverted" and "samples/s" in row["reason"] and "loss" not in row["reason"]:
            # Reverted: no gain beyond the noise, an inconclusive one, or one never measured at the best's load.
            assert (row["gain"] <= max(min_gain, row["noise"]) or "inconclusive" in row["reason"]
                    or "not measured at the load the best ran at" in row["reason"]), row
    best = next(t for t in rows if t["name"] == state["best"])
    assert best["decision"] in ("baseline", "kept")
    reference = next((t for t in rows if t["decision"] in ("baseline", "kept") and t["samples_per_s"]), None)
    if reference is not None and state["speedup"] is not None and state.get("speedup_basis", "direct") == "direct":
        assert math.isclose(state["speedup"], best["samples_per_s"] / reference["samples_per_s"], rel_tol=1e-9)
        kept = [t for t in rows if t["decision"] == "kept" and t["gain"] is not None
                and not str(t["recommendation"]).startswith("without-")]
        assert (state["speedup"] > 1 + min_gain) == bool(kept) or not kept, (state["speedup"], kept)


# The knobs each kind of change may move, and the direction of those with an order: everything else a trial
# holds must be the best's of its time (a change made on a best that was no longer the best breaks this).
MOVES = {"amp": {"amp"}, "pin-memory": {"pin_memory", "non_blocking"},
         "more-workers": {"num_workers", "persistent_workers", "threads"}, "larger-batch": {"batch_size"},
         "fewer-threads": {"threads"}, "fewer-copy-bytes": {"uint8_copies"}, "channels-last": {"channels_last"},
         "compile": {"compile"}, "fused-optimizer": {"fused_optimizer"}, "tf32": {"tf32"},
         "cudnn-benchmark": {"cudnn_benchmark"}}
UPWARD = {"more-workers": "num_workers", "larger-batch": "batch_size"}


def _effective(knobs: dict, user: dict, name: str):
    value = knobs.get(name)
    return user.get(name) if value is None else value


def assert_every_trial_on_its_best(state: dict) -> int:
    """Every proposed trial was made on the best the session held when it ran (its `base`), and moved only
    what its change names, in the change's direction, one value a knob; returns how many were checked."""
    rows, user = state["trials"], state.get("user_values") or {}
    by_name = {t["name"]: t for t in rows}
    best, checked = rows[0]["name"], 0
    for row in rows[1:]:
        kinds = [k for k in str(row.get("recommendation")).split("+") if k in MOVES]
        if row.get("recommendation") not in (None, "confirm") and kinds and not str(row["recommendation"]).startswith("oom-"):
            assert row.get("base") == best, (row["name"], row.get("base"), best)
            base = by_name[best]
            named = set().union(*(MOVES[k] for k in kinds))
            for knob, value in row["knobs"].items():
                if knob not in named:
                    assert value == base["knobs"].get(knob), (row["name"], knob, base["knobs"].get(knob), value)
            for kind in kinds:
                knob = UPWARD.get(kind)
                if knob is not None and row["knobs"].get(knob) is not None:
                    before = _effective(base["knobs"], user, knob) or 0
                    assert row["knobs"][knob] > before, (row["name"], knob, before, row["knobs"][knob])
            if row.get("moves") is not None:
                assert row["knobs"] == {**base["knobs"], **row["moves"]}, (row["name"], row["moves"])
            checked += 1
        if row["decision"] in ("kept", "baseline"):
            best = row["name"]
    return checked
