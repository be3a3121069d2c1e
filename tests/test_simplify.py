"""A model knob the best holds without a gain of its own is taken off once, and the simpler setting kept
unless it measures slower (advisor.search.simplify), on the recorded CPU session of the conv example and its
recorded CPU surface."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

from advisor.search.decision import Decision
from advisor.search.draws import PRIOR, between, measured_spread
from advisor.search.session import run_session
from advisor.search.simplify import fewer_changes, keep_simpler, simplifies, swap_proposal, takes_off, unproven_knobs, \
    without_proposal
from advisor.search.proposal import Proposal
from advisor.search.state import SessionOptions
from advisor.search.trial_runner import as_runner
from advisor.search.strategy import surface_space
from advisor.trials.knobs import Knobs
from advisor.trials.replay.surface import ReplayRunner, load_surface
from advisor.trials.record import load_trial
from conftest import SAMPLE_RUNS, SURFACES
from records import on_records, session

unproven_knobs, swap_proposal = on_records(unproven_knobs), on_records(swap_proposal)  # records written as JSON
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


def test_the_simpler_setting_counts_the_draws_between_the_two_processes():
    """A run of the best without a knob, against the best's run: each is a draw of its setting's level, so -6 %
    with windows' noise 4 % is no reading of "slower" beside the draws (on the CPU, `PRIOR` a process)."""
    draws = between(PRIOR, 1, 1)
    slower_by_windows = Decision(False, "-6.0% samples/s: slower (noise 4.0%)", -0.06, 0.04)
    kept = keep_simpler(slower_by_windows, 0.03, draws)
    assert kept.keep and "with the draws between processes" in kept.reason, kept
    assert not keep_simpler(slower_by_windows, 0.03).keep  # the windows alone: slower
    far = Decision(False, "-25.0% samples/s: slower (noise 4.0%)", -0.25, 0.04)
    assert not keep_simpler(far, 0.03, draws).keep


def test_of_two_settings_the_runs_cannot_tell_apart_the_one_that_changes_less_is_the_answer():
    """Within one standard error of the windows' noise with the draws between the two processes, the setting that
    changes less of the script stands, in either direction; a lead beyond it (the demo's confirmation read batch 64
    + channels_last on the workers +13.8 %, noise 12 %: likely ahead even beside the draws), settings that are not
    one inside the other, or a difference only in how batches reach the step (nothing computed differs) leave the
    decision as it was."""
    workers = {"num_workers": 2, "persistent_workers": True, "threads": 1}
    bigger = {**workers, "batch_size": 64, "channels_last": True}
    draws = between(PRIOR, 1, 1)
    ahead = Decision(True, "+7.0% samples/s (noise 6.0%)", 0.07, 0.06)
    stays = fewer_changes(ahead, workers, bigger, draws)
    assert not stays.keep and "the best changes less of the script" in stays.reason, stays
    assert fewer_changes(ahead, workers, bigger, 0.0) == ahead  # beyond one standard error of the windows alone
    behind = Decision(False, "-5.0% samples/s is within the noise (noise 12.0%)", -0.05, 0.12)
    taken = fewer_changes(behind, bigger, workers, draws)
    assert taken.keep and "it changes less of the script" in taken.reason, taken
    demo = Decision(True, "+13.8% samples/s (noise 12.0%)", 0.138, 0.12)
    assert fewer_changes(demo, workers, bigger, draws) == demo
    other_batch = {**workers, "batch_size": 128}
    assert fewer_changes(ahead, {**workers, "batch_size": 64}, other_batch, draws) == ahead  # neither inside the other
    eight_bit = {**workers, "uint8_copies": True}
    assert fewer_changes(ahead, workers, eight_bit, draws) == ahead  # how batches reach the step: the faster
    loss = Decision(False, "loss rose from 1 to 2 (more than 0.25)", 0.01, 0.12)
    assert fewer_changes(loss, bigger, workers, draws) == loss


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
                        runner=NoCompiler(points, out), script=False, space=surface_space(points), outputs=False)
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


def test_the_confirmation_keeps_the_setting_that_changes_less_where_the_runs_cannot_tell_them_apart(tmp_path):
    """Replayed at 10 % on the CPU image surface (seed 5): 8-bit images with batch 64 were kept at +11.7 % over the
    workers (noise 23 %), where 8-bit images alone had read +10.7 %; the end's confirmation then read the two within
    0.7 % of each other, and batch 64 stood (327 samples/s on the surface, where batch 32 is 334). Within the noise
    and the draws between processes, the answer is the setting that leaves the batch (and the learning rate
    that goes with it) as the script has it."""
    points = load_surface(SURFACES / "cpu-image-classifier")
    out = tmp_path / "s"
    state = run_session("cpu-image-classifier:replay", out, SessionOptions(max_trials=len(points) // 3),
                        log=lambda m: None, runner=ReplayRunner(points, out, 0.10, 5), script=False,
                        space=surface_space(points), outputs=False)
    final = Knobs.from_dict(state["final_knobs"])
    assert final.uint8_copies and final.num_workers == 2 and final.batch_size is None, final
    flipped = [t for t in state["trials"] if t["reason"].endswith("it changes less of the script")]
    assert flipped and flipped[0]["knobs"]["batch_size"] is None and flipped[0]["decision"] == "kept", flipped


def test_the_draws_are_the_runners_where_it_knows_them_else_the_devices():
    """A replay serves its own draws (none, or those asked for); a live runner's are the CPU truth surfaces' on
    the CPU, and none said on a GPU, whose draws were never measured."""
    points = load_surface(SURFACES / "cpu-image-classifier")
    cpu, cuda = session(device={"type": "cpu"}), session(device={"type": "cuda"})
    assert measured_spread(cpu, ReplayRunner(points, Path("unused"), 0.10, 5)) == 0.0
    assert measured_spread(cpu, ReplayRunner(points, Path("unused"), 0.10, 5, draws=0.03)) == 0.03
    live = as_runner(lambda name, knobs, **options: None)
    assert measured_spread(cpu, live) == PRIOR and measured_spread(cuda, live) == 0.0
