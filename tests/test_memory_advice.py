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
from advisor.trials.harness.trial_facts import cpu_computes_bf16
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from conftest import ROOT, SAMPLE_RUNS

HUNGRY = ROOT / "examples" / "memory_hungry.py"
LEAKY = ROOT / "examples" / "leaky_loss.py"


@pytest.mark.slow
def test_out_of_memory_baseline_ends_in_a_configuration_that_fits(tmp_path):
    # 0.7 GiB: the user's batch (a profiled step holds 1.7 GiB at its peak) runs out, and so do bf16 (0.9 GiB,
    # tried only where the CPU computes it), checkpointing the blocks (0.85 GiB) and micro-batches of 8 (2 × 8,
    # 0.85 GiB); micro-batches of 4 (4 × 4, 0.45 GiB) fit.
    # The budget ends the session at the fit: the baseline, AMP where it is tried, three recoveries.
    options = SessionOptions(steps=1, wait=1, warmup=0, max_trials=4 + cpu_computes_bf16(),
                             memory_limit=parse_size("0.7G"), device="cpu", windows=0)
    out = tmp_path / "session"
    state = run_session(f"{HUNGRY}:train_step", out, options, command="test", log=lambda m: None)
    trials = state["trials"]
    assert trials[0]["status"] == "oom" and trials[0]["decision"] == "failed"
    fitted = next(t for t in trials if t["decision"] == "kept")
    assert fitted["status"] == "ok"
    final = state["final_knobs"]
    # Recovery tried the closest configurations first: AMP where the CPU computes bf16, then checkpointing the
    # blocks (the batch as written), then micro-batches, never a smaller batch; the first that fits is kept.
    changes = [t["change"] for t in trials[1:]]
    assert changes == ["AMP bf16"] * cpu_computes_bf16() + ["activation checkpointing of the Block blocks (the batch "
                                                           "as written)", "micro-batches 8×2", "micro-batches 4×4"]
    assert all(t["status"] == "oom" for t in trials[1:-1]) and fitted is trials[-1]
    ckpt = json.loads((out / trials[-3]["folder"] / "trial.json").read_text())
    assert ckpt["checkpoint_plan"]["block"] == "Block" and ckpt["checkpoint_plan"]["count"] == 4
    summary = json.loads((out / fitted["folder"] / "trial.json").read_text())["summary"]
    assert (summary["micro_batch_size"], summary["effective_batch_size"]) == (4, state["user_values"]["batch_size"])
    assert final["accumulation_steps"] == 4 and not final["checkpointing"]
    assert "ACCUMULATION_STEPS" in (out / "suggested.patch").read_text()
    assert any("ran out of memory" in n for n in state["notes"])
    ids = [r["id"] for r in state["recommendations"]]
    assert "activation-checkpointing" in ids
    # The out-of-memory baseline's own record names the block to checkpoint.
    advice = activation_checkpointing_advice(json.loads((out / trials[0]["folder"] / "trial.json").read_text()))
    assert advice is not None and advice.id == "activation-checkpointing"
    assert "Block" in advice.title and "checkpoint(" in advice.code_change
    assert any("ran out of memory" in e for e in advice.evidence)


def test_leaking_step_is_reported_with_its_growth_and_line(tmp_path):
    result = run_trial(TrialSpec(f"{LEAKY}:train_step", Knobs(), tmp_path / "leak", name="leak", steps=4, device="cpu"))
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
