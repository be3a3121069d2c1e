"""Real sessions on the examples (CPU), and a session killed with SIGKILL and resumed (the search's own
parts are tested in test_search)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from advisor.analysis.analyze import analyze_path
from advisor.analysis.bound import BOUNDS
from advisor.trials.knobs import Knobs
from advisor.search.predictions import predicted_change, step_share
from advisor.search.session import run_session
from advisor.search.state import SESSION_FILE, SessionOptions, document
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from conftest import ROOT, require
from session_checks import assert_decisions_follow_measurements

IMAGE = ROOT / "examples" / "image_classifier.py"
TEXT = ROOT / "examples" / "char_transformer.py"


def copy_trial(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.slow
def test_session_on_the_image_classifier_grows_workers_first(tmp_path):
    out = tmp_path / "session"
    # The baseline and the first change: which change comes first, and its decision, are the claims.
    options = SessionOptions(steps=2, max_trials=2, device="cpu", windows=2, window_s=0.3)
    state = run_session(f"{IMAGE}:train_step", out, options, command="test", log=lambda m: None)
    assert state["status"] == "done"
    saved = json.loads((out / SESSION_FILE).read_text())
    assert saved == json.loads(json.dumps(document(state)))  # the record as the search held it, key for key
    names = [t["name"] for t in saved["trials"]]
    assert names[0] == "00-baseline" and len(names) <= 3  # with the best measured again, where the load moved
    for t in saved["trials"]:
        assert (out / t["folder"] / "trial.json").exists()
        assert t["decision"] in ("baseline", "kept", "reverted", "failed")
    # The loader is the bottleneck at num_workers=0 (as the baseline measured it): the first change tried is
    # more workers; what was kept and reverted follows from what each trial measured on this machine.
    first = saved["trials"][1]
    assert first["tried_under"] in (*BOUNDS, None)  # None: the baseline measured no clear bound
    if first["tried_under"] == "input":
        assert first["recommendation"] == "more-workers" and first["helps_now"], first
    assert_decisions_follow_measurements(saved)
    # What the report's verdict shows is recorded: the baseline's own bound (with why), the folder the command
    # ran in, and each prediction in the unit of the measured gain (a change in samples/s).
    baseline = saved["trials"][0]
    assert baseline["bound"] in (*BOUNDS, None) and isinstance(baseline["bound_evidence"], list)
    assert saved["cwd"] == os.getcwd()
    for t in saved["trials"][1:]:
        if t["predicted_gain"] is not None and t["predicted_gain"] < 1:
            assert t["predicted_samples_gain"] == pytest.approx(1 / (1 - t["predicted_gain"]) - 1)
    assert (out / "report.html").exists()
    # The script's static findings travel with the session into its report.
    assert "dataloader-num-workers" in {f["rule"] for f in saved["lint"]}
    assert 'id="lint"' in (out / "report.html").read_text()
    assert saved["trials"][0]["bound"] in (*BOUNDS, None)  # the baseline's row has its own bound too
    assert set(saved["core_use"]) == {"cores", "ranks", "workers", "threads", "all_used"}
    # bf16 autocast is tried where this CPU has bf16 instructions; where it has none, a note says why it never is.
    bf16 = saved["device"]["cpu"]["bf16_instructions"]
    said = [n for n in saved["notes"] if n.startswith("bf16 autocast (AMP) is not tried on this CPU")]
    assert len(said) == (0 if bf16 else 1), saved["notes"]
    if saved["final_knobs"] and any(v is not None for v in saved["final_knobs"].values()):
        assert saved["patch_root"] == str(ROOT)  # the patch's paths start at the repository's top
        check_patch_reproduces_settings(out, saved, tmp_path / "repo")
    else:  # nothing measured better on this machine: nothing to change
        assert saved["patch"] is None and not (out / "suggested.patch").exists()


def check_patch_reproduces_settings(out: Path, saved: dict, repo: Path) -> None:
    require("patch")
    """Apply suggested.patch to a copy of the example; its own settings are then the kept ones."""
    kept = {k: v for k, v in saved["final_knobs"].items() if v is not None}
    assert saved["patch"] == "suggested.patch"
    (repo / "examples").mkdir(parents=True)
    shutil.copy(IMAGE, repo / "examples" / IMAGE.name)
    (repo / "examples" / "data").symlink_to(IMAGE.parent / "data")  # the images the trials generated
    applied = subprocess.run(["patch", "-p1", "-i", str(out / "suggested.patch")], cwd=repo,
                             capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    patched = repo / "examples" / IMAGE.name
    result = run_trial(TrialSpec(f"{patched}:train_step", Knobs(), repo / "trial", name="patched", steps=2,
                                 device="cpu"))
    assert result.ok, result.message
    user = json.loads((repo / "trial" / "trial.json").read_text())["user_values"]
    for knob in ("batch_size", "num_workers", "pin_memory"):
        if knob in kept:
            assert user[knob] == kept[knob], (knob, user, kept)
    if kept.get("amp"):
        assert "torch.autocast" in patched.read_text()


@pytest.mark.slow
def test_session_on_the_char_transformer_decides_on_what_it_measured(tmp_path):
    out = tmp_path / "session"
    # torch.compile is left out: on a CPU it takes a minute or more, and its trials are test_conv_session's.
    options = SessionOptions(steps=2, max_trials=2, device="cpu", windows=2, window_s=0.3,
                             script_args=("--context", "64", "--batch-size", "8"), skip=("compile",))
    state = run_session(f"{TEXT}:train_step", out, options, command="test", log=lambda m: None)
    assert state["status"] == "done"
    assert not any(t["knobs"].get("compile") for t in state["trials"])
    # Compute-bound: bf16 autocast addresses it where the CPU computes bf16 natively and the trace's matmul
    # share calls for it, and is tried first unless the what-if model (its priors: nothing was measured yet)
    # prices another compute change higher. On a CPU without bf16 instructions (emulated bf16 is slower than
    # fp32) AMP is never tried.
    tried = [t["recommendation"] for t in state["trials"][1:]]
    cpu = (state["device"] or {}).get("cpu") or {}
    if cpu.get("bf16_instructions") and state["trials"][1]["tried_under"] == "compute":
        baseline, first = state["trials"][0], state["trials"][1]
        advised = {r.id for r in analyze_path(out / baseline["folder"])[0].recommendations}
        if "amp" in advised:
            amp = step_share(predicted_change(state, baseline["name"], baseline["knobs"],
                                              {**baseline["knobs"], "amp": "bf16"}, params={}))
            assert first["recommendation"] == "amp" or first["predicted_gain"] >= amp, (amp, first)
            if first["recommendation"] == "amp":
                assert first["knobs"]["amp"] == "bf16" and first["predicted_gain"] == pytest.approx(amp), first
    elif cpu.get("bf16_instructions"):  # a busy machine can make the baseline measure another bound
        assert tried and state["trials"][1]["tried_under"] in (*BOUNDS, None), state["trials"][1]
    else:
        assert "amp" not in tried and tried, tried
    assert_decisions_follow_measurements(state)
