"""`advisor analyze` on the project's own CPU runs in sample_runs/ (real profiled trials on this CPU)."""

from __future__ import annotations

import json

import pytest

from advisor.analysis.analyze import analyze_file, analyze_path
from conftest import SAMPLE_RUNS, advisor_main, run_advisor

RUNS = sorted(SAMPLE_RUNS.glob("*/trials/*/trial.json"))


def _traces_of(trial_json):
    """The trial's traces: one, or one per rank of a data-parallel trial (by rank)."""
    return sorted(trial_json.parent.glob("*.pt.trace.json.gz"))


def _trace_of(trial_json):
    (trace,) = _traces_of(trial_json)
    return trace


def _summaries(trial: dict) -> list[dict]:
    """The trial's summary per trace: each rank's own in a data-parallel trial."""
    return [r["summary"] for r in trial["ranks"]] if trial.get("ranks") else [trial["summary"]]


def test_sample_runs_exist():
    names = {p.parts[-4] for p in RUNS}
    assert {"image_classifier", "char_transformer"} <= names
    for name in names:  # each is a recorded session: its record, report and trials
        assert (SAMPLE_RUNS / name / "session.json").exists() and (SAMPLE_RUNS / name / "report.html").exists()


@pytest.mark.parametrize("trial_json", RUNS, ids=lambda p: f"{p.parts[-4]}-{p.parts[-2]}")
def test_cpu_trace_matches_its_trial(trial_json):
    trial = json.loads(trial_json.read_text())
    traces, summaries = _traces_of(trial_json), _summaries(trial)
    assert len(traces) == len(summaries)
    for trace, summary in zip(traces, summaries):
        d = analyze_file(trace)
        assert d.platform == "cpu" and d.device is None and d.gpu_utilization is None
        assert d.trial["name"] == trial["name"]
        assert len(d.steps) == summary["steps_recorded"]
        # The trace's steps and the trial's own wall-clock timing describe the same steps.
        assert d.extra["median_step_us"] / 1e6 == pytest.approx(summary["median_step_s"], rel=0.10)
        assert sum(d.breakdown_share.values()) == pytest.approx(1.0, abs=1e-6)
        assert d.breakdown_us["kernel"] == 0 and d.copies.count == 0


def test_image_classifier_is_dataloader_bound():
    trial_json = SAMPLE_RUNS / "image_classifier" / "trials" / "00-baseline" / "trial.json"
    d = analyze_file(_trace_of(trial_json))
    assert d.dataloader_share > 0.5
    assert d.recommendations[0].id == "more-workers"
    assert not any(r.id in ("pin-memory", "non-blocking", "larger-batch") for r in d.recommendations), \
        "no GPU advice on a CPU trace"


def test_trials_run_under_autocast_are_not_told_to_use_it():
    for trial_json in RUNS:
        trial = json.loads(trial_json.read_text())
        if trial["knobs"].get("amp"):
            for trace in _traces_of(trial_json):
                assert "amp" not in [r.id for r in analyze_file(trace).recommendations]


def test_char_transformer_is_matmul_bound_and_gets_bf16():
    trial_json = SAMPLE_RUNS / "char_transformer" / "trials" / "00-baseline" / "trial.json"
    d = analyze_file(_trace_of(trial_json))
    assert d.dataloader_share < 0.05
    assert d.extra["cpu_eligible_share"] > 0.3
    amp = next(r for r in d.recommendations if r.id == "amp")
    assert amp.knobs == {"amp": "bf16"}


def test_sample_runs_folder_cli():
    proc = run_advisor("analyze", str(SAMPLE_RUNS))
    assert proc.returncode == 0, proc.stderr
    assert "image_classifier.py, trial 00-baseline" in proc.stdout
    assert "char_transformer.py, trial 00-baseline" in proc.stdout
    assert len(analyze_path(SAMPLE_RUNS)) == sum(len(_traces_of(run)) for run in RUNS)


@pytest.mark.parametrize("trial_json", RUNS, ids=lambda p: f"{p.parts[-4]}-{p.parts[-2]}")
def test_cpu_trace_json_document(trial_json):
    proc = advisor_main("analyze", "--json", str(trial_json.parent))  # the JSON it prints (its process: elsewhere)
    assert proc.returncode == 0, proc.stderr
    traces = json.loads(proc.stdout)["traces"]
    assert len(traces) == len(_traces_of(trial_json))
    for t in traces:
        assert t["platform"] == "cpu" and t["device"] is None and t["gpu_utilization"] is None
        assert t["eligible_op_share"] is None and 0 <= t["eligible_share"] <= 1
    assert t["trial"]["name"] == trial_json.parent.name
