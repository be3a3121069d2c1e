"""Out of memory and wasted memory, end to end: a session that recovers from an out-of-memory baseline
under a real memory cap, and leak advice from a real leaking trial."""

from __future__ import annotations

import json

import pytest

from advisor.analysis.analyze import analyze_file
from advisor.code.lint import script_findings
from advisor.trials.knobs import Knobs
from advisor.analysis.rules.memory import activation_checkpointing_advice, memory_growth_advice
from advisor.search.session import run_session
from advisor.search.state import SessionOptions
from advisor.cli import parse_size
from advisor.trials.process.runner import run_trial
from conftest import ROOT, SAMPLE_RUNS

HUNGRY = ROOT / "examples" / "memory_hungry.py"
LEAKY = ROOT / "examples" / "leaky_loss.py"


@pytest.mark.slow
def test_out_of_memory_baseline_ends_in_a_configuration_that_fits(tmp_path):
    # 0.9 GiB of writable memory: the user's batch runs out, bf16 alone still does, and so do
    # micro-batches of 8 (2 × 8); micro-batches of 4 (4 × 4) fit.
    options = SessionOptions(steps=1, wait=1, warmup=0, max_trials=5, memory_limit=parse_size("0.9G"), device="cpu",
                             windows=0)
    out = tmp_path / "session"
    state = run_session(f"{HUNGRY}:train_step", out, options, command="test", log=lambda m: None)
    trials = state["trials"]
    assert trials[0]["status"] == "oom" and trials[0]["decision"] == "failed"
    fitted = next(t for t in trials if t["decision"] == "kept")
    assert fitted["status"] == "ok"
    final = state["final_knobs"]
    # Recovery tried the closest configurations first: AMP, then checkpointing the blocks (the batch as written),
    # then micro-batches, never a smaller batch; the first that fits is kept.
    changes = [t["recommendation"] for t in trials[1:]]
    order = ["oom-amp", "oom-checkpointing", "oom-accumulation"]
    assert "oom-smaller-batch" not in changes and "oom-checkpointing" in changes
    assert changes == sorted(changes, key=order.index)
    user_batch = state["user_values"]["batch_size"]
    record = json.loads((out / fitted["folder"] / "trial.json").read_text())
    summary = record["summary"]
    assert summary["effective_batch_size"] == user_batch
    patch = (out / "suggested.patch").read_text()
    if fitted["recommendation"] == "oom-checkpointing":  # the user's batch in one step
        assert final["checkpointing"] and not final["accumulation_steps"] and summary["batch_size"] == user_batch
        assert "checkpoint_sequential(self.blocks, len(self.blocks), " in patch
    else:  # micro-batch × accumulation steps
        assert final["accumulation_steps"] and final["accumulation_steps"] > 1 and not final["checkpointing"]
        assert summary["micro_batch_size"] * final["accumulation_steps"] == user_batch
        assert "ACCUMULATION_STEPS" in patch
    assert any("ran out of memory" in n for n in state["notes"])
    ids = [r["id"] for r in state["recommendations"]]
    assert "activation-checkpointing" in ids
    # The out-of-memory baseline's own record names the block to checkpoint.
    advice = activation_checkpointing_advice(json.loads((out / trials[0]["folder"] / "trial.json").read_text()))
    assert advice is not None and advice.id == "activation-checkpointing"
    assert "Block" in advice.title and "checkpoint(" in advice.code_change
    assert any("ran out of memory" in e for e in advice.evidence)


def test_leaking_step_is_reported_with_its_growth_and_line(tmp_path):
    result = run_trial(f"{LEAKY}:train_step", Knobs(), tmp_path / "leak", name="leak", steps=4, device="cpu")
    assert result.ok, result.message
    (trace,) = sorted(result.path.glob("*.pt.trace.json.gz"))
    d = analyze_file(trace, linter=script_findings)
    leak = next(r for r in d.recommendations if r.id == "memory-growth")
    assert d.recommendations[0] is leak  # a leak comes before any speed advice
    assert leak.details["bytes_per_step"] > 4 * 2**20
    assert any("leaky_loss.py:" in e and "total_loss" in e for e in leak.evidence)
    assert ".item()" in leak.code_change or ".detach()" in leak.code_change


@pytest.mark.parametrize("example", ["image_classifier", "char_transformer"])
def test_steady_examples_are_not_reported_as_leaking(example):
    trial = json.loads((SAMPLE_RUNS / example / "trials" / "00-baseline" / "trial.json").read_text())
    assert memory_growth_advice(trial) is None
    (trace,) = sorted((SAMPLE_RUNS / example / "trials" / "00-baseline").glob("*.pt.trace.json.gz"))
    assert "memory-growth" not in [r.id for r in analyze_file(trace).recommendations]
