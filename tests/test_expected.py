"""The search spends each trial where the most speed is likely (issue 66): every candidate on one scale, the
expected improvement over the best; a lever the trace points at is measured before a move read within its noise
is measured again; pairs are chosen by the what-if model's price of both moves together; and on a ridge that
one move at a time walks off (replayed from real H100 trial folders), sessions end on its best."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import shutil
import sys

import msgspec
import pytest

from advisor.search.best import best_trial as best_trial_of, bound_of
from advisor.search.bounds import Bound
from advisor.search.budget import STOP_SHARE
from advisor.search.decision import Decision
from advisor.search.expected import (calibrated, deferred_for, expected_improvement, levers_left, prior_for, rank,
                                     repriced, untried, value)
from advisor.search.predictions import predicted_change, session_params
from advisor.search.proposal import on_best
from advisor.search.record import typed
from advisor.search.state import SessionOptions
from advisor.search.strategy import SearchSpace, propose, surface_space
from advisor.trials.knobs import Knobs
from advisor.trials.replay.surface import load_surface
from conftest import ROOT
from test_proposals import STEADY, replay
from test_search import Traced, best_trial, gpu_state, rec
from records import on_records, record, row

sys.path.insert(0, str(ROOT / "benchmarks"))
from pair_surfaces import build_surface  # noqa: E402

# The records these tests write as JSON, given to the search as it holds them.
calibrated, deferred_for, levers_left, prior_for, rank, repriced, untried, value, predicted_change, session_params, \
    propose = map(on_records, (calibrated, deferred_for, levers_left, prior_for, rank, repriced, untried, value,
                               predicted_change, session_params, propose))

TRIALS_H200 = ROOT / "tests" / "data" / "trials" / "h200-conv-session"  # a real H200 session's records


def spread(kind: str, state: dict) -> float:
    """σ of a change of this kind in this session: its prior, narrowed or widened by the rows of its kind."""
    return calibrated(kind, state, prior_for(kind, state))[1]


def test_expected_improvement_is_the_mean_of_the_gain_above_zero():
    # E[max(0, X)], X ~ N(0, σ²) = σ/√(2π); a sure gain is itself; a sure loss is worth nothing.
    assert expected_improvement(0.0, 0.2) == pytest.approx(0.2 / math.sqrt(2 * math.pi))
    assert expected_improvement(0.3, 0.0) == 0.3 and expected_improvement(-0.3, 0.0) == 0.0
    # Worth more with a larger mean, and with a wider spread at the same mean.
    assert expected_improvement(0.1, 0.1) > expected_improvement(0.0, 0.1) > expected_improvement(-0.1, 0.1) > 0
    assert expected_improvement(0.0, 0.3) > expected_improvement(0.0, 0.1)


def test_a_lever_the_model_prices_at_zero_is_not_vetoed_by_the_rule_order():
    """Under a loader bound on an H100, AMP (fp32 matrix products off the Tensor Cores) priced at +0 % and a
    larger batch priced at +3 % that addresses the bound: the old order (the bound first, then the price) put
    the batch first and AMP behind every move that "helps now"; on one scale AMP's wide spread is worth more."""
    best = Knobs(num_workers=4, persistent_workers=True)
    state = gpu_state()
    amp = on_best(best, {"amp": "bf16"}, "amp", "AMP bf16", "amp-bf16", 0.0, "compute", helps_now=False)
    batch = on_best(best, {"batch_size": 64}, "larger-batch", "batch 32→64", "batch-64", 0.03, "host", helps_now=True)
    assert [p.recommendation for p in rank([batch, amp], state)] == ["amp", "larger-batch"]
    # A change the trace says addresses the bound is wider (there is room): among equals it goes first.
    workers = on_best(best, {"num_workers": 8}, "more-workers", "workers 4→8", "workers-8", 0.0, "input")
    idle = on_best(best, {"num_workers": 8}, "more-workers", "workers 4→8", "workers-8", 0.0, "input",
                   helps_now=False)
    assert value(workers, state) > value(idle, state)


def test_the_session_learns_the_models_error_on_a_kind_of_change():
    """A row measured from another best narrows or widens its kind's spread; rows measured from the best of now
    that the model priced alike (the rungs of a ladder) move its next price of their kind by what they missed."""
    best = Knobs(num_workers=4, persistent_workers=True)
    state = gpu_state()
    state["best"] = here = "00-baseline"
    prior = spread("amp", state)
    state["trials"].append({"status": "ok", "recommendation": "amp", "predicted_samples_gain": 0.0, "gain": 0.01,
                            "noise": 0.04, "base": "elsewhere", "knobs": Knobs(amp="bf16").to_dict()})
    assert spread("amp", state) < prior  # the model was right about AMP there: less to hope for, or fear
    batch = on_best(best, {"batch_size": 256}, "larger-batch", "batch 128→256", "batch-256", 0.0, "host",
                    helps_now=False)
    before = value(batch, state)
    state["trials"].append({"status": "ok", "recommendation": "larger-batch", "predicted_samples_gain": 0.0,
                            "gain": 0.9, "noise": 0.04, "base": "elsewhere", "knobs": Knobs(batch_size=64).to_dict()})
    assert spread("larger-batch", state) > prior and value(batch, state) > 3 * before  # missed by 90 points
    workers = on_best(best, {"num_workers": 8}, "more-workers", "workers 4→8", "workers-8", 0.41, "input")
    before = value(workers, state)
    missed = {"status": "ok", "recommendation": "more-workers", "predicted_samples_gain": 0.70, "gain": -0.11,
              "noise": 0.04, "knobs": Knobs(num_workers=6).to_dict()}
    # Overpriced by 81 points from this best: the next worker count is worth a fraction of what it was.
    assert value(workers, {**state, "trials": [*state["trials"], {**missed, "base": here}]}) < 0.25 * before
    # The same miss from another best, or at a setting the model priced otherwise, only widens the spread.
    assert value(workers, {**state, "trials": [*state["trials"], {**missed, "base": "elsewhere"}]}) >= before
    priced_otherwise = {**missed, "base": here, "predicted_samples_gain": 1.03}
    assert value(workers, {**state, "trials": [*state["trials"], priced_otherwise]}) >= before
    assert spread("amp+pin-memory", gpu_state()) > spread("amp", gpu_state())  # a pair: both moves' spreads
    assert spread("pin-memory", state) == spread("pin-memory", gpu_state())  # a kind no row measured: the prior


def test_a_worker_count_overpriced_on_a_real_h200_waits_behind_the_levers_not_measured(tmp_path):
    """Real records of `make gpu-check`'s conv session on an H200: on batch 128 the trace shows the loop waiting
    38 % of the step for its loader, and the model priced every worker count at +70 %. Workers 0→2 measured
    -11 %; the session then spent its last two search trials on workers 4 (-15 %) and 8 (-9 %), each priced
    +70 % again and ranked higher than before (the miss had only widened its spread), and pinned copies, AMP
    and 8-bit images went unmeasured. The miss now moves the price: pinned copies, not measured yet, go before
    the next worker count, which is worth a fraction of the first."""
    session = tmp_path / "session"
    for folder in TRIALS_H200.iterdir():
        if folder.is_dir():
            (session / "trials" / folder.name).mkdir(parents=True)
            for trace in folder.glob("*.pt.trace.json.gz"):
                shutil.copy(trace, session / "trials" / folder.name / trace.name)
            (session / "trials" / folder.name / "trial.json").write_bytes(
                gzip.decompress((folder / "trial.json.gz").read_bytes()))
    recorded = typed(json.loads((TRIALS_H200 / "session.json").read_text()))
    state = msgspec.structs.replace(recorded, trials=recorded.trials[:3], best="02-batch-128")
    best = best_trial_of(session, state)
    diagnosis, _, bound = bound_of(session, state, best)
    assert bound.name == "input"
    first = rank(propose(diagnosis, bound, best, state, SessionOptions(), SearchSpace()), state)
    assert first[0].change == "workers 0→2"  # the loader binds: the first worker count leads
    state.trials = recorded.trials[:4]
    workers_2 = state.trials[3]
    assert workers_2.gain < -0.1 and workers_2.predicted_samples_gain > 0.6
    after = rank(propose(diagnosis, bound, best, state, SessionOptions(), SearchSpace()), state)
    worth = {p.change: value(p, state) for p in after}
    order = [p.change for p in after]
    assert order.index("pin_memory + non_blocking copies") < order.index("workers 0→4"), worth
    assert worth["workers 0→4"] < 0.25 * value(first[0], msgspec.structs.replace(state, trials=recorded.trials[:3]))
    # The model itself learnt it: the hand-off that workers 0→2 measured prices the next count below zero, and the
    # row's miss, read against the model as it is now, is gone (not counted a second time in the spread).
    params = session_params(state)
    assert predicted_change(state, "02-batch-128", best.knobs, {**best.knobs.to_dict(), "num_workers": 4}, params) < 0
    assert abs(repriced(state, [workers_2], params)[id(workers_2)] - workers_2.gain) < 0.05


def test_a_move_within_its_noise_waits_while_a_lever_is_unmeasured():
    """Batch 32→128 read +3 % with 10 % noise. Measured again it could still turn out +10 %, but AMP and pinned
    copies, which no trial measured yet, are worth more: the re-measure waits; once every lever was measured,
    it is worth its trial."""
    best = Knobs(num_workers=4, persistent_workers=True)
    state = record(gpu_state())
    batch = on_best(best, {"batch_size": 128}, "larger-batch", "batch 32→128", "batch-128", 0.03, "host")
    amp = on_best(best, {"amp": "bf16"}, "amp", "AMP bf16", "amp-bf16", 0.0, "compute", helps_now=False)
    within = Decision(False, "+3.0% samples/s is within the noise", 0.03, 0.10, inconclusive=True)
    why = deferred_for(within, batch, [amp], state)
    assert why is not None and why.startswith("AMP bf16, not measured yet, is worth more"), why
    state.trials.append(row(status="ok", recommendation="amp", knobs=Knobs(amp="bf16").to_dict()))
    assert untried([amp], state) == [] and deferred_for(within, batch, [amp], state) is None
    # The budget's end says which levers were left, and keeps them in the record.
    assert levers_left([amp], gpu_state()) == "; never measured: AMP bf16"


def test_the_top_of_the_workers_ladder_is_a_candidate_beside_its_next_step():
    """A step of the ladder that reads nothing (4→8) does not hide the top of it (14), which a larger batch or
    pinned copies can make pay: both are candidates, ranked by their expected improvement."""
    proposals = propose(Traced("input", [rec("more-workers", 0.5)]), Bound("input"),
                        best_trial(Knobs(num_workers=4, persistent_workers=True)), gpu_state(), SessionOptions(),
                        SearchSpace())
    assert sorted(p.knobs.num_workers for p in proposals if p.recommendation == "more-workers") == [8, 14]


def test_a_loader_wait_is_a_candidate_by_what_it_can_take_back_not_by_a_fixed_share():
    """The diagnosis feeds the prior, not a gate: under a compute bound, a DataLoader wait of 4 % of the step was
    below the 5 % the rule asked for, and more workers were never a candidate. Now the wait is a candidate
    whatever its share, worth no more than that wait can give, and proposed where that could reach the least
    gain the session keeps (--min-gain, 3 %): a wait of 4 % can (+4.2 %), one of 1 % cannot (+1.0 %)."""
    from advisor.analysis.rules import ranked
    from advisor.analysis.worth import ceiling

    best = best_trial(Knobs(num_workers=2, persistent_workers=True))
    for wait, proposed in ((0.04, True), (0.01, False)):
        workers = dataclasses.replace(rec("more-workers", 0.9 * wait), recoverable=wait, helps_now=False)
        found = propose(Traced("compute", [workers]), Bound("compute"), best, gpu_state(), SessionOptions(),
                        SearchSpace())
        mine = [p for p in found if p.recommendation == "more-workers"]
        assert bool(mine) == proposed, (wait, mine)
        assert all(p.recoverable == wait and value(p, gpu_state()) <= ceiling(wait) * 1.01 for p in mine)
        # The same figure ranks the advice: worth at most what the wait can give, where the prior alone is +12 %.
        (advice,) = ranked([workers], "gpu")
        assert 0 < advice.worth <= ceiling(wait) * 1.01 < expected_improvement(0.0, 0.30)


@pytest.fixture(scope="module")
def ridge(tmp_path_factory):
    """The ridge surface of benchmarks/pair_surfaces.py (90 points from real H100 trial folders)."""
    return build_surface("ridge", tmp_path_factory.mktemp("ridge") / "surface")[0]


@pytest.mark.parametrize("seed", [6, 7])
def test_a_ridge_session_measures_every_lever_and_ends_on_the_best(tmp_path, ridge, seed):
    """At 10 % noise these seeds ended at 0.31 and 0.46 of the ridge's best: workers 8 and 14 read slower at
    batch 32, the batch ladder read within its noise, and the budget went to re-measures and pairs with the next
    worker count. Now the top of the ladder, pinned copies and AMP are each measured, the batch climbs on a fed
    loader, and the session ends on the best (bf16, batch 512, 14 workers, pinned copies), within 19 trials."""
    points = load_surface(ridge)
    state = replay(ridge, tmp_path / "s", 0.10, seed, options=SessionOptions(max_trials=19))
    rows = state["trials"]
    assert len(rows) <= 19
    measured = {k for t in rows if t["status"] == "ok" for k in str(t.get("recommendation")).split("+")}
    assert {"amp", "pin-memory", "more-workers", "larger-batch"} <= measured, measured
    final = Knobs.from_dict(state["final_knobs"])
    assert (final.amp, final.num_workers, final.pin_memory, final.non_blocking) == ("bf16", 14, True, True), final
    assert final.batch_size >= 256, final
    assert not state.get("unmeasured")
    assert len(points) == 90 and surface_space(points).values("batch_size") == (32, 64, 128, 256, 512)


def test_a_real_loader_bound_h200_session_measures_every_lever_and_ends_on_the_best(tmp_path):
    """The ridge's shape measured on a real H200 (tests/data/surfaces/h200-image-classifier: the image classifier
    over AMP x batch x workers x pinned copies): at 10 % noise the session measures workers, pinned copies, AMP
    and the batch within its third of the points, and ends on the surface's best, fp32 at batch 32 with 8
    workers and pinned copies (924 samples/s, 7.5x the baseline)."""
    surface = ROOT / "tests" / "data" / "surfaces" / "h200-image-classifier"
    state = replay(surface, tmp_path / "s", 0.10, 0)
    rows = state["trials"]
    assert len(rows) <= len(load_surface(surface)) // 3
    measured = {k for t in rows if t["status"] == "ok" for k in str(t.get("recommendation")).split("+")}
    assert {"amp", "pin-memory", "more-workers", "larger-batch"} <= measured, measured
    final = Knobs.from_dict(state["final_knobs"])
    assert (final.amp, final.batch_size, final.num_workers, final.pin_memory) == (None, None, 8, True), final
    assert not state.get("unmeasured")


def test_a_confirmation_within_the_noise_does_not_undo_a_setting_kept_beyond_it(tmp_path):
    """Replayed at 10 % with a drifting load on the steady H100 surface: batch 64 was kept over 8 workers at
    +21 % (noise 5 %, beside the best at one load); the end's confirmation read the workers' setting +11 % ahead
    (noise 19 %) and, on its faster figure, went back to it (0.83 of the surface's best, where batch 64 is 0.89).
    The runner-up's lead within the noise does not outweigh a decision beyond it."""
    state = replay(STEADY, tmp_path / "s", 0.10, 3, drift=1.0)
    final = Knobs.from_dict(state["final_knobs"])
    assert (final.batch_size, final.num_workers) == (64, 8), final
    confirms = [t for t in state["trials"] if t.get("recommendation") == "confirm" and t["knobs"].get("batch_size") != 64
                and t.get("gain") is not None]
    assert confirms and all(t["decision"] == "reverted" and abs(t["gain"]) <= t["noise"] for t in confirms)


def test_a_move_first_run_at_another_load_gets_its_remeasure_like_any_other(tmp_path):
    """Replayed at 10 % with a drifting load on the steady H100 surface (seed 7): AMP + pinned copies (the surface's
    best, +20 % over 8 workers) first ran at a load the best never ran at, so it ran again beside the best: +10.8 %
    within a noise of 11.5 %, reverted, and never measured again; the budget went to batch moves and the session
    ended on 8 workers (0.83 of the best). The run that could not be compared is no reading: the one beside the
    best is the first that counts, and, within its noise, it is measured once more like any other."""
    state = replay(STEADY, tmp_path / "s", 0.10, 7, drift=1.0)
    final = Knobs.from_dict(state["final_knobs"])
    assert (final.amp, final.pin_memory, final.num_workers) == ("bf16", True, 8), final
    runs = [t for t in state["trials"] if t.get("recommendation") == "amp+pin-memory"]
    assert len(runs) == 3 and runs[1]["reason"].endswith("(beside the best, at one load)"), runs
    assert runs[2]["reason"].endswith("(its runs at one load with the best's)") and runs[2]["decision"] == "kept", runs


def test_eight_bit_images_are_a_candidate_beside_workers_and_win_the_confirmation_at_one_load(tmp_path):
    """Replayed at 10 % with a drifting load on the CPU image surface (2 cores): after workers 0→2 (threads
    2→1) the trace reads compute-bound, and 8-bit images were no longer offered (their rule speaks for the loader
    and the copies alone), or, once measured within the noise, lost the end's confirmation because the runs of
    the two spanned loads (0.955 of the surface's best). They are offered wherever there are workers, and the
    confirmation, decided on the windows of both at one load, keeps the faster of two settings that differ only
    in how batches reach the step (1.00)."""
    surface = ROOT / "tests" / "data" / "surfaces" / "cpu-image-classifier"
    state = replay(surface, tmp_path / "s", 0.10, 3, drift=1.0)
    final = Knobs.from_dict(state["final_knobs"])
    assert final.uint8_copies and final.num_workers == 2, final
    assert any(t.get("recommendation") == "confirm" and t["decision"] == "kept" and t["knobs"].get("uint8_copies")
               for t in state["trials"])


def test_the_session_stops_once_no_change_left_is_worth_a_trial(tmp_path):
    """Replayed at 10 % on the CPU image surface (2 cores, 36 trials): workers 0→2 and 8-bit images kept, batch 64
    reverted; what is left (batch 128, which the session's own batch 64 priced near +0 %) is worth less than half
    the least gain worth keeping, and the search spent trials on it before the end. Now it stops there, with every
    lever the trace pointed at measured, and goes to the confirmation with the budget to spare: on the surface's
    best."""
    surface = ROOT / "tests" / "data" / "surfaces" / "cpu-image-classifier"
    options = SessionOptions(max_trials=36)
    state = replay(surface, tmp_path / "s", 0.10, 0, options=options)
    rows = state["trials"]
    stop = next(n for n in state["notes"] if n.startswith("stopped"))
    assert stop.startswith("stopped: the answer is known"), stop
    most = float(stop.rsplit(": ", 1)[1].rstrip("%)")) / 100
    assert most < STOP_SHARE * options.min_gain, stop
    search = [t for t in rows[1:] if t.get("recommendation") != "confirm"]
    assert len(search) <= 4 and len(rows) < options.max_trials and not state.get("unmeasured"), [t["name"] for t in rows]
    measured = {k for t in rows if t["status"] == "ok" for k in str(t.get("recommendation")).split("+")}
    assert {"more-workers", "fewer-copy-bytes", "larger-batch"} <= measured, measured
    final = Knobs.from_dict(state["final_knobs"])
    assert (final.num_workers, final.threads, final.uint8_copies, final.batch_size) == (2, 1, True, None), final
