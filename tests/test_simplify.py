"""A model knob the best holds without a gain of its own is taken off once, and the simpler setting kept
unless it measures slower (advisor.search.simplify), on the recorded CPU session of the conv example and its
recorded CPU surface."""

from __future__ import annotations

import dataclasses

import copy
import json

from advisor.search.decision import Decision
from advisor.search.session import run_session
from advisor.search.simplify import keep_simpler, simplifies, swap_proposal, takes_off, unproven_knobs, without_proposal
from advisor.search.proposal import Proposal
from advisor.search.state import SessionOptions
from advisor.search.strategy import surface_space
from advisor.trials.knobs import Knobs
from advisor.trials.replay.surface import ReplayRunner, load_surface
from advisor.trials.record import load_trial
from conftest import SAMPLE_RUNS, SURFACES

CONV = SAMPLE_RUNS / "conv_classifier" / "session.json"


def conv_session() -> dict:
    return json.loads(CONV.read_text())


def test_a_knob_kept_within_twice_its_noise_is_unproven_once_another_is_kept_on_top():
    state = conv_session()
    rows = {t["name"]: t for t in state["trials"]}
    fused, amp = rows["03-try-fused-optimizer"], rows["04-amp-bf16"]
    assert fused["decision"] == amp["decision"] == "kept" and fused["gain"] < 2 * fused["noise"]
    assert rows["01-try-channels-last"]["gain"] > 2 * rows["01-try-channels-last"]["noise"]
    assert state["best"] == amp["name"] and unproven_knobs(state) == ["fused_optimizer"]
    # Before AMP was kept on top, the narrow keep was the latest change: nothing to take off yet.
    state["trials"] = state["trials"][:4]
    state["best"] = fused["name"]
    assert unproven_knobs(state) == []


def test_the_knob_is_taken_off_the_best_once():
    state = conv_session()
    best = Knobs.from_dict(next(t for t in state["trials"] if t["name"] == state["best"])["knobs"])
    proposal = without_proposal(best, "fused_optimizer")
    assert simplifies(proposal) and proposal.change == "without the fused optimizer"
    assert proposal.knobs == Knobs(amp="bf16", channels_last=True)  # the rest of the best stays
    row = dict(copy.deepcopy(state["trials"][-1]), name="05-without-fused-optimizer", decision="reverted",
               recommendation=proposal.recommendation, knobs=proposal.knobs.to_dict(), base=state["best"])
    state["trials"].append(row)
    assert unproven_knobs(state) == []  # measured without it once: it is not taken off again


def test_a_pair_whose_first_move_alone_was_reverted_leaves_that_knob_unproven():
    # The knob grid's session (benchmarks/knob_grid.py): torch.compile alone was reverted, compile + bf16 kept.
    state = conv_session()
    rows = {t["name"]: t for t in state["trials"]}
    compiled = dict(rows["02-try-compile"], base="01-try-channels-last", recommendation="compile")
    pair = dict(rows["04-amp-bf16"], name="03-compile-and-amp-bf16", recommendation="compile+amp", decision="kept",
                knobs=dict(compiled["knobs"], amp="bf16"), base="01-try-channels-last")
    state["trials"] = [rows["00-baseline"], rows["01-try-channels-last"], compiled, pair]
    state["best"] = pair["name"]
    assert compiled["decision"] == "reverted" and unproven_knobs(state) == ["compile"]
    pair["recommendation"] = "compile"  # kept alone (on its own gain): proven
    assert unproven_knobs(state) == []


def test_the_simpler_setting_is_kept_unless_it_measured_slower():
    within = Decision(False, "-1.0% samples/s is within the noise (noise 4.0%)", -0.01, 0.04, inconclusive=False)
    kept = keep_simpler(within, 0.03)
    assert kept.keep and "not slower" in kept.reason and not kept.inconclusive
    slower = Decision(False, "-6.0% samples/s: slower (noise 4.0%)", -0.06, 0.04)
    assert not keep_simpler(slower, 0.03).keep
    loss = Decision(False, "loss rose from 1 to 2 (more than 0.25)", 0.0, 0.04)
    assert not keep_simpler(loss, 0.03).keep
    faster = Decision(True, "+9.0% samples/s (noise 4.0%)", 0.09, 0.04, inconclusive=False)
    assert keep_simpler(faster, 0.03) == faster


def test_a_model_knob_reverted_beside_another_is_tried_once_in_its_place():
    state = conv_session()
    rows = {t["name"]: t for t in state["trials"]}
    compiled = rows["02-try-compile"]  # torch.compile, reverted on top of channels_last
    assert compiled["decision"] == "reverted" and compiled["base"] == "01-try-channels-last"
    best = Knobs.from_dict(rows[compiled["base"]]["knobs"])
    reverted = Proposal("try", "--try compile", "try-compile", Knobs.from_dict(compiled["knobs"]), 0.0)
    swap = swap_proposal(state, best, reverted)
    assert swap.knobs == Knobs(compile=True) and swap.change == "--try compile without channels_last"
    assert takes_off(swap.recommendation) and not simplifies(swap)
    state["trials"].append(dict(compiled, name="03-swap", recommendation=swap.recommendation))
    assert swap_proposal(state, best, reverted) is None  # once
    # Nothing to swap: the best holds no other model knob, or the change turned more than one knob.
    assert swap_proposal(conv_session(), Knobs(), reverted) is None
    both = Proposal("try", "x", "x", Knobs(compile=True, fused_optimizer=True, channels_last=True), 0.0)
    assert swap_proposal(conv_session(), best, both) is None


NO_COMPILER = "not applicable: torch.compile failed: InvalidCxxCompiler: No working C++ compiler found"


class NoCompiler(ReplayRunner):
    """The conv example's CPU surface (fp32, batch 32) on a machine without a C++ compiler: a compile fails and
    the step runs eagerly, so a trial is served the eager recording of its setting and says its compile was
    not applicable, as a live trial does."""

    def __init__(self, points, out):
        super().__init__(points, out, noise=0.0)  # noise 0: every window is the recorded figure

    def __call__(self, name, knobs, against=None):
        if not knobs.compile:
            return super().__call__(name, knobs, against)
        result = super().__call__(name, dataclasses.replace(knobs, compile=None), against)
        path = result.path / "trial.json"
        record = json.loads(path.read_text())
        record["knobs"]["compile"] = True
        record["knob_outcomes"]["compile"] = NO_COMPILER
        path.write_text(json.dumps(record))
        return load_trial(result.path)


def test_a_change_found_not_applicable_is_never_swapped_in_for_a_kept_model_knob(tmp_path):
    """A compile that failed beside a kept channels_last changed nothing: it is not tried again in
    channels_last's place ('--try compile without channels_last'), nor proposed again at all."""
    points = [p for p in load_surface(SURFACES / "cpu-conv-classifier")
              if p.folder.name.startswith("amp=off-") and "-batch_size=32-compile=off-" in p.folder.name]
    out = tmp_path / "s"
    state = run_session("cpu-conv-classifier:replay", out,
                        SessionOptions(max_trials=8, tries=("channels_last", "compile")), log=lambda m: None,
                        runner=NoCompiler(points, out), script=False, space=surface_space(points))
    rows = {t["name"]: t for t in state["trials"]}
    changes = [t["change"] for t in state["trials"]]
    # What made the swap before: channels_last kept, then compile on top of it, not applicable.
    assert rows["01-try-channels-last"]["decision"] == "kept", changes
    assert rows["02-try-compile"]["decision"] == "not applicable", changes
    assert rows["02-try-compile"]["reason"] == "compile: " + NO_COMPILER.removeprefix("not applicable: ")
    assert not any(str(t["change"]).startswith("--try compile without") for t in state["trials"]), changes
    compiled = [t for t in state["trials"] if t["knobs"].get("compile")]
    assert [t["name"] for t in compiled] == ["02-try-compile"], changes  # never proposed again, in any form
    assert state["status"] == "done" and state["final_knobs"]["channels_last"] and not state["final_knobs"]["compile"]
