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
