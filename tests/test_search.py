"""The search: steady-state measurement and its noise, the bound of a trial, the strategy that follows
it, and whole sessions replayed on a response surface recorded on a real H100."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
import statistics
import sys
from pathlib import Path

import pytest
from session_checks import assert_decisions_follow_measurements
from trial_helpers import trial_record, write_script

from advisor.trials.knobs import Knobs
from advisor.trials.replay.surface import ReplayRunner, load_surface, settings_of
from advisor.analysis.rules import Recommendation
from advisor.search.bounds import trial_bound
from advisor.trials.record.measurement import measure, noise
from advisor.search.state import SessionOptions
from advisor.search.decision import decide
from advisor.search.trial_runner import measure_record, recorded_losses
from advisor.knobs.batch_size import fit_memory, next_batch_size
from advisor.knobs.num_workers import ladder as worker_ladder
from advisor.search.strategy import SearchSpace, propose as propose_on_record, surface_space
from advisor.search.session import run_session
from advisor.trials.record import TrialResult
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from conftest import ROOT, SURFACES, TRACES, advisor_main, whole_at
from records import record

SURFACE = SURFACES / "h100-image-classifier"
TRIALS = ROOT / "tests" / "data" / "trials" / "h200-conv-classifier"


def steps_of(walls, batch=32, window_size=None, call=None):
    """Step records with these wall times: in windows of `window_size` steps, or profiled (no windows)."""
    steps = []
    for i, wall in enumerate(walls):
        step = {"index": i, "wall_s": wall, "call_s": wall if call is None else call, "batch_size": batch,
                "recorded": window_size is None}
        if window_size:
            step["window"] = i // window_size
        steps.append(step)
    return steps


# --------------------------------------------------------------------------------------------------
# Measurement


def test_windows_carry_the_noise_and_more_windows_shrink_it():
    steady = measure([steps_of([0.1] * 12, window_size=4)])
    assert steady.source == "windows" and len(steady.windows) == 3
    assert steady.samples_per_s == pytest.approx(320.0) and steady.relative_se == pytest.approx(0.0)
    # A queue that fills and drains: single steps swing tenfold, windows that span its cycle do not.
    swinging = [0.02, 0.18] * 6
    windows = measure([steps_of(swinging, window_size=4)])
    assert windows.relative_se < 0.01 and windows.samples_per_s == pytest.approx(12 * 32 / 1.2)
    jumpy = measure([steps_of([0.05, 0.15, 0.1, 0.2, 0.08, 0.12], window_size=1)])
    longer = measure([steps_of([0.05, 0.15, 0.1, 0.2, 0.08, 0.12] * 4, window_size=1)])
    assert longer.relative_se < jumpy.relative_se
    lo, hi = jumpy.interval
    assert lo < jumpy.samples_per_s < hi


def test_runs_of_the_same_settings_pool_their_windows():
    one = measure([steps_of([0.1, 0.12, 0.09, 0.11], window_size=1)])
    two = measure([steps_of([0.1, 0.12, 0.09, 0.11], window_size=1)] * 2)
    assert two.samples_per_s == pytest.approx(one.samples_per_s) and len(two.windows) == 2 * len(one.windows)
    assert two.relative_se < one.relative_se


def test_recordings_without_windows_fall_back_to_blocks_of_steps():
    alternating = measure([steps_of([0.02, 0.2, 0.03, 0.19, 0.02, 0.21])])
    assert alternating.source == "blocks" and len(alternating.windows) == 3
    assert max(alternating.windows) / min(alternating.windows) < 1.1  # pairs even out the swing
    assert alternating.samples_per_s == pytest.approx(6 * 32 / 0.67)
    independent = measure([steps_of([0.10, 0.11, 0.12, 0.11, 0.10])])
    assert independent.source == "steps" and len(independent.windows) == 5


def test_wait_share_is_the_time_outside_the_step():
    waiting = measure([steps_of([0.2] * 6, window_size=2, call=0.05)])
    assert waiting.wait_share == pytest.approx(0.75)


def test_a_loss_lower_because_training_went_further_is_no_reason_to_revert(tmp_path):
    # Real records of an H200 session: with 14 workers the trial waited 29 steps for its loader before it profiled,
    # the baseline 2, so its profiled steps were further into training and their loss lower (about 0.8 against 1.7).
    folders = {}
    for name in ("00-baseline", "05-workers-14"):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / "trial.json").write_bytes(gzip.decompress((TRIALS / f"{name}.trial.json.gz").read_bytes()))
    base, workers = (measure_record([trial_record(f)]) for f in folders.values())
    reference, losses = (recorded_losses(f) for f in folders.values())
    assert statistics.median(losses) < 0.75 * statistics.median(reference)  # what the old check reverted
    decision = decide(base, workers, losses, reference, 0.03)
    assert decision.keep and decision.gain > 0.3, decision.reason


def test_decisions_follow_the_noise_and_the_loss():
    base = measure([steps_of([0.1, 0.11, 0.09, 0.1, 0.1, 0.11], window_size=2)])
    same = decide(base, base, [], [], 0.03)
    assert not same.keep and same.gain == pytest.approx(0.0) and "within the noise" in same.reason
    faster = measure([steps_of([0.05, 0.055, 0.045, 0.05, 0.05, 0.055], window_size=2)])
    assert decide(base, faster, [1.0], [1.0], 0.03).keep
    assert not decide(base, faster, [float("nan")], [1.0], 0.03).keep
    assert "loss rose" in decide(base, faster, [5.0], [1.0, 1.05], 0.03).reason
    assert "% samples/s (noise" in decide(base, faster, [1.0], [1.0], 0.03).reason
    # Steps that knew no batch size are measured, and decided, in steps/s.
    steps = measure([steps_of([0.1, 0.11, 0.09, 0.1, 0.1, 0.11], batch=None, window_size=2)])
    quicker = measure([steps_of([0.05, 0.055, 0.045, 0.05, 0.05, 0.055], batch=None, window_size=2)])
    assert steps.unit == "steps/s" and "% steps/s (noise" in decide(steps, quicker, [], [], 0.03).reason
    # A gain within two standard errors but beyond one: kept only for a change that addresses the bound.
    noisy = measure([steps_of([0.1, 0.2, 0.1, 0.2, 0.15, 0.1], window_size=1)])
    gain_over_noise = 0.75 * noise(noisy, noisy)  # between one and two standard errors
    candidate = measure([steps_of([w / (1 + gain_over_noise) for w in [0.1, 0.2, 0.1, 0.2, 0.15, 0.1]],
                                  window_size=1)])
    plain = decide(noisy, candidate, [], [], 0.03)
    assert not plain.keep and plain.inconclusive
    assert decide(noisy, candidate, [], [], 0.03, addresses_bound=True).keep


def test_memory_model_and_batch_search():
    predict = fit_memory([(32, 4e9)])
    assert predict(64) == pytest.approx(8e9)  # one point: proportional to the batch (safe side)
    predict = fit_memory([(32, 4e9), (64, 6e9)])
    assert predict(128) == pytest.approx(10e9)  # two points: a line with a fixed part
    assert next_batch_size(64, [(32, 4e9), (64, 6e9)], 16e9, 0.85, None) == 128
    size = next_batch_size(128, [(32, 4e9), (64, 6e9), (128, 10e9)], 16e9, 0.85, None)
    assert size is not None and predict(size) <= 0.85 * 16e9 and size > 128
    assert next_batch_size(128, [(128, 10e9)], None, 0.85, 256) == 192  # bisect below an OOM
    assert next_batch_size(128, [(128, 10e9)], None, 0.85, 136) is None
    # A surface offers only the sizes it recorded.
    assert next_batch_size(32, [], None, 0.85, None, sizes=(32, 64, 128)) == 64
    assert next_batch_size(128, [], None, 0.85, None, sizes=(32, 64, 128)) is None


# --------------------------------------------------------------------------------------------------
# Bound and strategy


class Traced:
    """What the strategy reads of a diagnosis: its bound and recommendations (real Recommendation values)."""

    def __init__(self, bound=None, recommendations=()):
        self.bound, self.bound_evidence, self.recommendations = bound, ("from the trace",), tuple(recommendations)


BOUND_OF = {"more-workers": "input", "amp": "compute", "pin-memory": "copy", "larger-batch": "host"}


def rec(id_, gain, knobs=None):
    return Recommendation(id=id_, title=id_, knobs=knobs or {}, predicted_gain=gain, evidence=(), code_change="",
                          bound=BOUND_OF[id_])


def test_the_steady_state_decides_an_input_bound():
    waiting = measure([steps_of([0.2] * 6, window_size=2, call=0.05)])
    assert trial_bound("ok", Traced("compute"), waiting).name == "input"  # the windows saw the loop wait
    busy = measure([steps_of([0.2] * 6, window_size=2)])
    assert trial_bound("ok", Traced("compute"), busy).name == "compute"
    assert trial_bound("ok", Traced("input"), busy).name is None  # the queue hid nothing: unclear
    assert trial_bound("oom", None, None).name == "memory"


def propose(diagnosis, bound, best, state, *args):
    """The strategy's proposals on a record written as its JSON."""
    return propose_on_record(diagnosis, bound, best, record(state), *args)


def gpu_state(trials=(), cores=16):
    return {"device": {"type": "cuda", "cpu": {"logical_cores": cores},
                       "gpu": {"compute_capability": "9.0", "bf16_supported": True}},
            "user_values": {"batch_size": 32, "num_workers": 0, "pin_memory": False},
            "trials": [{"status": "ok", "knobs": Knobs().to_dict(), "batch_size": 32, "peak_memory_bytes": 1e9,
                        "capacity_bytes": 80e9, "decision": "baseline", "recommendation": None},
                       *trials]}


def best_trial(knobs=Knobs(), batch=32):
    return TrialResult(name="best", status="ok", message="", path=Path("."), knobs=knobs, knob_outcomes={},
                       batch_size=batch)


def tried(knobs, recommendation, decision, bound, status="ok"):
    return {"status": status, "knobs": knobs.to_dict(), "batch_size": 32, "peak_memory_bytes": 1e9,
            "decision": decision, "recommendation": recommendation, "tried_under": bound}


def test_worker_ladder_leaves_cores_to_the_training_process():
    assert worker_ladder(16) == (2, 4, 8, 14)
    assert worker_ladder(2) == (2,) and worker_ladder(4) == (2, 4) and worker_ladder(1) == (2,)


def test_tf32_waits_for_amp_which_does_more_of_the_same():
    """On the H100's fp32 trace the diagnosis advises both AMP and TF32. TF32, whose module says it comes after AMP,
    is proposed only once AMP was tried and not kept, and never on a best that holds AMP; the advised fused
    optimizer is proposed from the start."""
    from advisor.analysis.analyze import analyze_file
    from advisor.search.bounds import Bound

    diagnosis = analyze_file(TRACES / "h100-char-transformer-fp32.pt.trace.json.gz")
    assert {"amp", "tf32"} <= {r.id for r in diagnosis.recommendations}

    def proposed(state, knobs=Knobs()):
        return [p.recommendation for p in propose(diagnosis, Bound("compute"), best_trial(knobs), state,
                                                  SessionOptions(), SearchSpace())]

    first = proposed(gpu_state())
    assert "amp" in first and "fused-optimizer" in first and "tf32" not in first
    after_amp = gpu_state([tried(Knobs(amp="bf16"), "amp", "reverted", "compute")])
    assert "tf32" in proposed(after_amp)
    assert "tf32" not in proposed(after_amp, Knobs(amp="bf16"))


def test_the_bound_orders_the_round_and_workers_climb_past_a_size_that_did_not_help():
    from advisor.search.bounds import Bound

    options = SessionOptions()
    recs = [rec("more-workers", 0.9), rec("amp", 0.3, {"amp": "bf16"}), rec("pin-memory", 0.12)]
    proposals = propose(Traced("input", recs), Bound("input"), best_trial(), gpu_state(), options, SearchSpace())
    assert proposals[0].recommendation == "more-workers" and proposals[0].knobs.num_workers == 2
    # The other changes for the loader's bound: the top of the workers' ladder (where the step between reads
    # nothing) and 8-bit images, so that the workers stop converting (measured).
    assert proposals[0].helps_now and [(p.recommendation, p.knobs.num_workers) for p in proposals[1:]
                                       if p.helps_now] == [("more-workers", 14), ("fewer-copy-bytes", None)]
    pinned = next(p for p in proposals if p.recommendation == "pin-memory")
    assert pinned.knobs.pin_memory and pinned.knobs.non_blocking  # one change: either alone does little
    # 2 → 4 did not help while the loader still binds: the ladder goes on to 8 from the best (2).
    two = Knobs(num_workers=2, persistent_workers=True)
    state = gpu_state([tried(Knobs(num_workers=4, persistent_workers=True), "more-workers", "reverted", "input")])
    proposals = propose(Traced("input", recs), Bound("input"), best_trial(two), state, options, SearchSpace())
    assert proposals[0].knobs.num_workers == 8
    # On a 2-core CPU the first size (1 worker) moved the threads 2→1 with it and read within the noise: the
    # next size (2) is the direction's next move, from the same best (the threads are not its base).
    cpu = {**gpu_state([tried(Knobs(num_workers=1, persistent_workers=True, threads=1), "more-workers", "reverted",
                              "input")], cores=2), "device": {"type": "cpu", "cpu": {"logical_cores": 2}}}
    cpu["user_values"]["threads"] = 2
    proposals = propose(Traced("input", recs), Bound("input"), best_trial(), cpu, options,
                        SearchSpace(held={"num_workers": (0, 1, 2)}))
    assert (proposals[0].knobs.num_workers, proposals[0].knobs.threads) == (2, 1)


def test_a_change_reverted_under_one_bound_is_tried_again_once_the_bound_moves():
    from advisor.search.bounds import Bound

    options = SessionOptions()
    recs = [rec("amp", 0.3, {"amp": "bf16"})]
    state = gpu_state([tried(Knobs(amp="bf16"), "amp", "reverted", "input")])
    still = propose(Traced("input", recs), Bound("input"), best_trial(Knobs(num_workers=8)), state, options,
                    SearchSpace())
    assert "amp" not in [p.recommendation for p in still]
    moved = propose(Traced("compute", recs), Bound("compute"), best_trial(Knobs(num_workers=8)), state, options,
                    SearchSpace())
    assert moved[0].recommendation == "amp" and moved[0].helps_now
    # Under the same bound: clearly slower on the best it was tried on, AMP waits while the best is that best,
    # and is measured again once the best outgrew it (by RETRY_GROWTH) or, had it read within its noise, once
    # the best is another setting.
    base = dict(gpu_state()["trials"][0], name="00-baseline", samples_per_s=100.0)
    slower = dict(tried(Knobs(amp="bf16"), "amp", "reverted", "input"), name="01-amp-bf16", base="00-baseline",
                  gain=-0.2, noise=0.05)
    state = dict(gpu_state(), trials=[base, slower])
    same = dict(base, name="02-workers-8", knobs=Knobs(num_workers=8).to_dict(), samples_per_s=110.0)
    proposals = propose(Traced("input", recs), Bound("input"),
                        dataclasses.replace(best_trial(Knobs(num_workers=8)), name="02-workers-8"),
                        dict(state, trials=[base, slower, same]), options, SearchSpace())
    assert "amp" not in [p.recommendation for p in proposals]
    grown = dict(same, samples_per_s=130.0)
    proposals = propose(Traced("input", recs), Bound("input"),
                        dataclasses.replace(best_trial(Knobs(num_workers=8)), name="02-workers-8"),
                        dict(state, trials=[base, slower, grown]), options, SearchSpace())
    assert "amp" in [p.recommendation for p in proposals]
    within = dict(slower, gain=0.01)
    proposals = propose(Traced("input", recs), Bound("input"),
                        dataclasses.replace(best_trial(Knobs(num_workers=8)), name="02-workers-8"),
                        dict(state, trials=[base, within, same]), options, SearchSpace())
    assert "amp" in [p.recommendation for p in proposals]


# --------------------------------------------------------------------------------------------------
# Steady-state windows in a real trial


def test_a_trial_measures_windows_after_its_profiled_steps(tmp_path):
    script = write_script(tmp_path, """
        import time
        import torch
        from torch.utils.data import DataLoader

        def train_step(x):
            time.sleep(0.01)
            return x.float().mean()

        if __name__ == "__main__":
            for epoch in range(100):
                for x in DataLoader(list(range(64)), batch_size=4, num_workers=2, persistent_workers=True):
                    train_step(x)
    """)
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=2, wait=1, warmup=1,
                                 device="cpu", windows=3, window_s=0.1))
    assert result.ok, result.message
    record = trial_record(result.path)
    schedule = record["schedule"]
    # Two workers queue 2 × 2 batches before the first step: skipped before profiling, and again after it.
    assert schedule["queue_depth"] == 4 and schedule["settle"] == 4 and schedule["windows_measured"] == 3
    phases = [s["phase"] for s in record["steps"]]
    assert phases[:8] == ["wait"] * 5 + ["warmup"] + ["profiled"] * 2
    assert phases[8:12] == ["settle"] * 4 and set(phases[12:]) == {"window"}
    windows = [s for s in record["steps"] if s["phase"] == "window"]
    for k in range(3):
        mine = [s for s in windows if s["window"] == k]
        assert len(mine) >= 2 and sum(s["wall_s"] for s in mine) >= 0.1
    steady = record["summary"]["steady"]
    assert steady["source"] == "windows" and len(steady["windows"]) == 3
    assert record["summary"]["samples_per_s"] == steady["samples_per_s"]
    lo, hi = steady["interval"]
    assert lo <= steady["samples_per_s"] <= hi


# --------------------------------------------------------------------------------------------------
# Replay


def surface_points():
    return load_surface(SURFACE)


def test_surface_settings_and_space():
    points = surface_points()
    assert len(points) == 52
    space = surface_space(points)
    assert space.values("num_workers") == (0, 2, 4, 8, 14) and space.values("batch_size") == (32, 64, 128)
    assert space.values("amp") == ("bf16",) and space.holds({"pin_memory": True, "non_blocking": True})
    assert not space.holds({"amp": "bf16", "batch_size": 256}) and "accumulation_steps" in space.skip
    user = points[0].user_values
    assert settings_of({}, user)[:6] == (None, 32, 0, False, False, 1)
    assert settings_of(Knobs(num_workers=8, persistent_workers=True).to_dict(), user)[:6] == (None, 32, 8, False, False, 1)
    assert not any(settings_of(Knobs(num_workers=8).to_dict(), user)[7:])  # no 8-bit copies nor model knob
    # The H100 surface holds one value of the threads and of every model knob: none of them is turned there.
    assert space.model_knobs == () and {"threads", "compile", "uint8_copies"} <= space.skip
    assert not {"num_workers", "batch_size", "amp", "pin_memory", "non_blocking"} & space.skip


def test_replay_finds_the_region_of_the_best_with_a_third_of_the_points(tmp_path):
    points = surface_points()
    best_recorded = max(trial_record(p.folder)["summary"]["samples_per_s"] for p in points)
    out = tmp_path / "replay"
    lines = []
    state = run_session(f"{SURFACE}:replay", out, SessionOptions(max_trials=len(points) // 3), log=lines.append,
                        runner=ReplayRunner(points, out), script=False, space=surface_space(points),
                        extra={"replay": str(SURFACE)})
    assert state["status"] == "done" and lines[0].startswith("budget:")
    best = next(t for t in state["trials"] if t["name"] == state["best"])
    found = trial_record(out / best["folder"])["summary"]["samples_per_s"]
    assert found >= 0.8 * best_recorded, [(t["change"], round(t["samples_per_s"] or 0), t["decision"])
                                          for t in state["trials"]]
    assert len(state["trials"]) <= len(points) // 3
    # The loader binds at no workers: the first change grows them, and workers keep growing while it binds.
    assert state["trials"][1]["recommendation"] == "more-workers"
    assert best["knobs"]["num_workers"] >= 8
    assert (out / "report.html").is_file() and not (out / "suggested.patch").exists()


def test_replay_of_a_setting_the_surface_lacks_is_a_failed_trial(tmp_path):
    points = surface_points()
    runner = ReplayRunner(points, tmp_path)
    missing = runner("01-bf16-b128-w8", Knobs(amp="bf16", batch_size=128, num_workers=8))
    assert missing.status == "error" and "holds no trial with" in missing.message
    served = runner("02-w8", Knobs(num_workers=8, persistent_workers=True))
    assert served.ok and trial_record(served.path)["name"] == "02-w8"
    assert served.samples_per_s == trial_record(SURFACE / "fp32-b32-w8-pageable")["summary"]["samples_per_s"]


def test_a_cpu_truth_surface_replays_its_model_knobs_and_the_search_reaches_its_best(tmp_path):
    # The CPU image surface varies threads and 8-bit copies, recorded three times a setting: the replay tells
    # those apart, the search may turn them, and a recording's "off" knob says nothing of a trial that leaves
    # it unset (its "not applicable" once kept the search from ever trying 8-bit copies).
    surface = SURFACES / "cpu-image-classifier"
    points = load_surface(surface)
    space = surface_space(points)
    assert space.model_knobs == ("uint8_copies",) and "threads" not in space.skip
    assert space.values("num_workers") == (0, 1, 2)
    doc = json.loads((surface / "surface.json").read_text())
    best_setting = max(doc["settings"], key=lambda s: s["samples_per_s"])
    out = tmp_path / "replay"
    state = replay(surface, out, 0.0, 0)
    assert not any(str(v).startswith("not applicable") for t in state["trials"] for v in (t.get("outcomes") or {}).values())
    best = next(t for t in state["trials"] if t["name"] == state["best"])
    served = Path(trial_record(out / best["folder"])["replayed_from"]).name
    assert served in best_setting["runs"], [(t["change"], t["decision"]) for t in state["trials"]]


# --------------------------------------------------------------------------------------------------
# Replay under noise, and knobs that pay only together

sys.path.insert(0, str(ROOT / "benchmarks"))
from pair_surfaces import build_surface  # noqa: E402


def replay(surface: Path, out: Path, noise: float | None, seed: int, max_trials: int | None = None) -> dict:
    """A session replayed on a surface, with drawn windows of this spread (None: as recorded)."""
    points = load_surface(surface)
    return run_session(f"{surface}:replay", out, SessionOptions(max_trials=max_trials or len(points) // 3),
                       log=lambda m: None, runner=ReplayRunner(points, out, noise, seed), script=False,
                       space=surface_space(points), extra={"replay": str(surface)}, outputs=False)


def served_settings(out: Path, state: dict) -> tuple:
    """The settings of the point the session's best was served from."""
    best = next(t for t in state["trials"] if t["name"] == state["best"])
    source = Path(trial_record(out / best["folder"])["replayed_from"])
    record = trial_record(source)
    return settings_of(record["knobs"], record["user_values"])


def test_noise_draws_windows_around_the_recording_and_a_seed_replays_the_same_session(tmp_path):
    points = surface_points()
    runner = ReplayRunner(points, tmp_path / "a", noise=0.05, seed=3)
    first = runner("01-w8", Knobs(num_workers=8, persistent_workers=True))
    again = runner("02-w8", Knobs(num_workers=8, persistent_workers=True))
    recorded = trial_record(SURFACE / "fp32-b32-w8-pageable")["summary"]["samples_per_s"]
    steady = [trial_record(t.path)["summary"]["steady"] for t in (first, again)]
    assert all(s["source"] == "windows" and len(s["windows"]) == 5 for s in steady)
    assert steady[0]["windows"] != steady[1]["windows"], "a re-measure carries its own noise"
    spread = statistics.pstdev(steady[0]["windows"] + steady[1]["windows"]) / recorded
    assert 0.01 < spread < 0.15 and runner.remeasure
    flat = ReplayRunner(points, tmp_path / "b", noise=0.0)("01-w8", Knobs(num_workers=8, persistent_workers=True))
    assert trial_record(flat.path)["summary"]["steady"]["windows"] == [pytest.approx(recorded)] * 5
    runs = [replay(SURFACE, tmp_path / f"s{i}", 0.05, seed=7, max_trials=8)["trials"] for i in range(2)]
    assert [(t["change"], t["samples_per_s"], t["decision"]) for t in runs[0]] == \
           [(t["change"], t["samples_per_s"], t["decision"]) for t in runs[1]]
    # Run with outputs=False (the helper's): the record, whole, and none of the outputs read by people.
    saved = json.loads((tmp_path / "s0" / "session.json").read_text())
    assert saved["status"] == "done" and saved["time"]["wall_s"] > 0 and len(saved["trials"]) == len(runs[0])
    assert not [p.name for p in (tmp_path / "s0").rglob("*") if p.name == "report.html" or "tfevents" in p.name]


def test_with_draws_each_served_trial_is_a_process_at_a_level_of_its_own(tmp_path):
    """The windows a seed draws are the same with draws as without, each trial's scaled by a level of its own:
    the spread between processes that no trial's windows show (`advisor.search.draws`)."""
    points, knobs = surface_points(), Knobs(num_workers=8, persistent_workers=True)

    def windows(folder, draws):
        runner = ReplayRunner(points, tmp_path / folder, noise=0.05, seed=3, draws=draws)
        return [trial_record(runner(f"{i:02d}-w8", knobs).path)["summary"]["steady"]["windows"] for i in range(6)]

    plain, drawn, again = windows("plain", None), windows("drawn", 0.1), windows("again", 0.1)
    assert drawn == again  # a seed replays the same draws
    levels = [statistics.mean(d[i] / p[i] for i in range(len(p))) for p, d in zip(plain, drawn)]
    for p, d, level in zip(plain, drawn, levels):
        assert [w * level for w in p] == pytest.approx(d)  # one level a trial, its windows' noise as without
    assert len({round(level, 6) for level in levels}) == len(levels) and 0.02 < statistics.pstdev(levels) < 0.3


def test_a_re_measure_serves_the_next_recording_of_a_setting(tmp_path):
    surface = tmp_path / "surface"
    for name in ("fp32-b32-w0-pageable", "fp32-b32-w2-pageable", "fp32-b32-w4-pageable"):
        shutil.copytree(SURFACE / name, surface / name)
    shutil.copytree(SURFACE / "fp32-b32-w2-pageable", surface / "fp32-b32-w2-pageable-second")
    runner = ReplayRunner(load_surface(surface), tmp_path / "out")
    assert runner.remeasure  # two recordings of one setting
    knobs = Knobs(num_workers=2, persistent_workers=True)
    served = [trial_record(runner(f"0{i}-w2", knobs).path)["replayed_from"] for i in range(3)]
    assert [Path(s).name for s in served] == ["fp32-b32-w2-pageable", "fp32-b32-w2-pageable-second",
                                              "fp32-b32-w2-pageable"]


def test_under_noise_every_recording_of_a_setting_is_served_around_the_setting_s_median(tmp_path):
    # The CPU conv surface's best two settings: their runs overlap (855/937/831 against 919/910/841 samples/s),
    # their medians do not. Drawn around each run's own figure, the served truth changed with how often a setting
    # was served, and the bench judged by the medians.
    surface = SURFACES / "cpu-conv-classifier"
    doc = json.loads((surface / "surface.json").read_text())
    setting = max(doc["settings"], key=lambda s: s["samples_per_s"])
    runs = {trial_record(surface / run)["summary"]["samples_per_s"] for run in setting["runs"]}
    assert len(runs) == 3  # three different figures
    runner = ReplayRunner(load_surface(surface), tmp_path, noise=0.0)
    knobs = Knobs.from_dict(setting["knobs"])
    served = [runner(f"0{i}-best", knobs) for i in range(3)]
    assert len({trial_record(t.path)["replayed_from"] for t in served}) == 3  # each recording in turn
    assert all(t.samples_per_s == pytest.approx(statistics.median(runs)) for t in served)


@pytest.mark.parametrize("name, seed", [("pinning_workers", 0), ("amp_batch", 1)])
def test_knobs_that_pay_only_together_are_found_under_noise(tmp_path, name, seed):
    """Pinned copies pay only with 14 workers, and 14 workers only with pinned copies (each alone −2%, both
    +77%); bf16 pays only with batch 64 (each alone −2%, both +40%). At 5% window-to-window spread the
    session finds the pair, in a third of the points."""
    surface, rates = build_surface(name, tmp_path / "surface")
    out = tmp_path / "session"
    state = replay(surface, out, 0.05, seed)
    best = max(rates, key=rates.get)
    rows = [(t["change"], round(t["samples_per_s"] or 0), t["decision"]) for t in state["trials"]]
    found = served_settings(out, state)[:4]  # (amp, batch, workers, pinned)
    assert rates[found] >= 0.95 * rates[best], (found, best, rows)
    assert len(state["trials"]) <= len(rates) // 3, rows
    assert any("+" in (t.get("recommendation") or "") for t in state["trials"]), "no pair was tried"
    assert_decisions_follow_measurements(state)


def test_the_cli_replays_under_noise_with_a_seed_and_refuses_a_bad_spread(tmp_path):
    runs = []
    for name in ("a", "b"):
        done = advisor_main("profile", "--replay", str(SURFACE), "--replay-noise", "0.05", "--seed", "4",
                           "--max-trials", "4", "--out", str(tmp_path / name), env={"COLUMNS": "80"})
        assert done.returncode == 0, done.stderr[-2000:]
        # Piped at 80 columns: the ladder is a list, nothing cut, no progress display.
        lines = done.stdout[done.stdout.index("Ladder"):].splitlines()  # the log lines before it: the terminal's
        assert "…" not in done.stdout, done.stdout
        whole_at(lines)
        assert " 00 baseline: baseline" in lines and "Next:" in lines, done.stdout
        state = json.loads((tmp_path / name / "session.json").read_text())
        assert state["replay_noise"] == 0.05 and state["replay_seed"] == 4
        runs.append([(t["change"], t["samples_per_s"]) for t in state["trials"]])
    assert runs[0] == runs[1]  # the same seed replays the same session
    bad = advisor_main("profile", "--replay", str(SURFACE), "--replay-noise", "2", "--out", str(tmp_path / "c"))
    assert bad.returncode == 2 and "--replay-noise: a relative spread in [0, 1)" in bad.stderr
    assert not (tmp_path / "c").exists()


def test_the_replay_bench_reads_the_session_it_replays(tmp_path):
    # benchmarks/replay_search.py reads run_session's record as session.json holds it (`state.document`): one of
    # its sessions, on a recorded surface, gives the figures its table is made of.
    import replay_search

    points = load_surface(SURFACE)
    found, trials, time = replay_search.one_session(SURFACE, points, 0.05, 1, tmp_path)
    assert found > 0 and 1 < trials <= replay_search.budget_of(SURFACE, points)
    assert time["wall_s"] > 0 and time["unmeasured"] >= 0
