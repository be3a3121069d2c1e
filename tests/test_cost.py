"""What a trial costs (advisor.search.cost, issue 71): a compile priced by its compile, a compile measured slower not
compiled again in another layout, and the time left to the answer on the progress line."""

from __future__ import annotations

import io
import json

from rich.console import Console

from records import row, session

from advisor.report.progress_line import TrialProgressDisplay
from advisor.knobs import BY_NAME
from advisor.search.cost import answer_seconds, by_cost, first_steps_seconds, slower_compile, trial_seconds
from advisor.search.decision import Decision
from advisor.search.expected import value
from advisor.search.proposal import on_best
from advisor.search.simplify import swap_proposal
from advisor.trials.knobs import Knobs
from advisor.trials.record.progress import TrialProgress

CPU = {"device": {"type": "cpu"}}


def timed_trial(out, name, seconds, compile_s=None):
    """A session row whose trial.json says it ran `seconds` (a compile's first steps included)."""
    folder = out / "trials" / name
    folder.mkdir(parents=True)
    (folder / "trial.json").write_text(json.dumps({"times": {"started_at": 1000.0, "ended_at": 1000.0 + seconds}}))
    return row(name=name, folder=f"trials/{name}", knobs={"compile": bool(compile_s)},
               compile={"compile_s": compile_s} if compile_s else None)


def test_a_compile_pays_for_its_compile_before_it_is_ranked_over_a_cheaper_trial(tmp_path):
    best = Knobs(amp="bf16", channels_last=True)
    compile_ = on_best(best, {"compile": True}, "compile", "torch.compile", "compile", 0.10)
    batch = on_best(best, {"batch_size": 64}, "larger-batch", "batch 32→64", "batch-64", 0.05)
    state = session(**CPU, trials=[timed_trial(tmp_path, "00-baseline", 8.0)])
    assert value(compile_, state) > value(batch, state)  # worth more, as a trial
    # ... but it costs its compile too: 40 s before the session measured one, beside a trial of 8 s.
    compiler = BY_NAME["compile"]
    assert trial_seconds(tmp_path, state) == 8.0 and first_steps_seconds(compiler, state) == 40.0
    assert by_cost([compile_, batch], tmp_path, state) == [batch, compile_]
    # A compile this machine did in 2 s (a small graph) is priced at that: the better bet goes first again.
    state.trials.append(timed_trial(tmp_path, "01-compile", 10.0, compile_s=2.0))
    assert first_steps_seconds(compiler, state) == 2.0
    assert by_cost([batch, compile_], tmp_path, state) == [compile_, batch]
    assert trial_seconds(tmp_path, state) == 8.0  # the compile's 10 s trial less its 2 s compile: a trial's 8 s
    # Without a compile among them, the strategy's order stands.
    assert by_cost([batch, compile_.__class__(**{**compile_.__dict__, "knobs": best})], tmp_path, state)[0] is batch


def test_a_compile_measured_slower_is_not_compiled_again_in_another_layout():
    best = Knobs(amp="bf16", channels_last=True)
    compile_ = on_best(best, {"compile": True}, "compile", "torch.compile", "compile", -0.19)
    swap = swap_proposal(session(), best, compile_)  # compile with channels_last off, as the loop would
    assert swap is not None and swap.knobs.compile and not swap.knobs.channels_last
    slower = Decision(False, "slower", gain=-0.29, noise=0.12)
    assert slower_compile(compile_, slower, swap, min_gain=0.03)  # the conv session: −29 %, then −13 %
    within = Decision(False, "within the noise", gain=-0.05, noise=0.12)
    assert not slower_compile(compile_, within, swap, min_gain=0.03)  # within its noise: the swap may tell
    # Where the model says the layout was the cause (it predicts the compile without it a gain), it is tried.
    said = swap.__class__(**{**swap.__dict__, "predicted_gain": 0.08})
    assert not slower_compile(compile_, slower, said, min_gain=0.03)


def test_the_progress_line_says_the_time_left_to_the_answer(tmp_path):
    state = session(**CPU, trials=[timed_trial(tmp_path, f"{i:02d}-t", 6.0) for i in range(3)])
    # Eight trials at most, three done and one running: four more after it, 6 s each.
    assert answer_seconds(tmp_path, state, max_trials=8) == 4 * 6.0
    assert answer_seconds(tmp_path, state, max_trials=8, running=2) == 3 * 6.0
    assert answer_seconds(tmp_path, state, max_trials=3) == 0.0
    out = io.StringIO()
    display = TrialProgressDisplay(Console(file=out, force_terminal=True, width=160))
    display.update(TrialProgress("03-amp", "window", 2, 5, elapsed_s=4.0, remaining_s=3.0, answer_s=24.0))
    display.progress.refresh()
    display.close()
    assert "the answer in at most 27 s" in out.getvalue()
