"""The optimization sequence: real sessions on the examples (CPU), keep/revert decisions on real trials,
the memory model, and a session killed with SIGKILL and resumed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advisor.knobs import Knobs
from advisor.session import (SESSION_FILE, SessionOptions, decide, fit_memory, median_noise, next_batch_size,
                             run_session)
from advisor.trial import load_trial, run_trial
from conftest import ROOT, SAMPLE_RUNS
from session_checks import assert_decisions_follow_measurements

IMAGE = ROOT / "examples" / "image_classifier.py"
TEXT = ROOT / "examples" / "char_transformer.py"


def copy_trial(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_same_trial_is_not_an_improvement(tmp_path):
    src = SAMPLE_RUNS / "image_classifier" / "trials" / "00-baseline"
    a = load_trial(copy_trial(src, tmp_path / "a"))
    b = load_trial(copy_trial(src, tmp_path / "b"))
    keep, reason, gain, noise = decide(a, b, [], min_gain=0.03)
    assert not keep and gain == pytest.approx(0.0) and "within the noise" in reason


def test_non_finite_loss_is_reverted(tmp_path):
    src = SAMPLE_RUNS / "char_transformer" / "trials" / "00-baseline"
    best = load_trial(copy_trial(src, tmp_path / "best"))
    cand_dir = copy_trial(src, tmp_path / "cand")
    record = json.loads((cand_dir / "trial.json").read_text())
    for step in record["steps"]:
        step["loss"] = float("nan")
    record["summary"]["samples_per_s"] *= 2  # faster, but diverged
    (cand_dir / "trial.json").write_text(json.dumps(record))
    keep, reason, _, _ = decide(best, load_trial(cand_dir), [1.0], min_gain=0.03)
    assert not keep and "not finite" in reason


def test_noise_grows_with_spread_and_shrinks_with_steps():
    steady = [0.100, 0.101, 0.099, 0.100, 0.102]
    jumpy = [0.05, 0.15, 0.10, 0.20, 0.08]
    assert median_noise(steady, steady) < 0.03 < median_noise(jumpy, jumpy)
    assert median_noise(jumpy * 4, jumpy * 4) < median_noise(jumpy, jumpy)


def test_memory_model_and_batch_search():
    # One point: memory taken as proportional to the batch (safe side).
    predict = fit_memory([(32, 4e9)])
    assert predict(64) == pytest.approx(8e9)
    # Two points: a line with a fixed part.
    predict = fit_memory([(32, 4e9), (64, 6e9)])
    assert predict(128) == pytest.approx(10e9)
    # Capacity 16 GB at 85%: 128 (10 GB) fits, 256 (18 GB) does not; the search stays under the cap.
    assert next_batch_size(64, [(32, 4e9), (64, 6e9)], 16e9, 0.85, None) == 128
    size = next_batch_size(128, [(32, 4e9), (64, 6e9), (128, 10e9)], 16e9, 0.85, None)
    assert size is not None and predict(size) <= 0.85 * 16e9 and size > 128
    # After an OOM at 256, bisect between the last size that ran and the one that failed.
    assert next_batch_size(128, [(128, 10e9)], None, 0.85, 256) == 192
    assert next_batch_size(128, [(128, 10e9)], None, 0.85, 136) is None


@pytest.mark.slow
def test_session_on_the_image_classifier_grows_workers_first(tmp_path):
    out = tmp_path / "session"
    options = SessionOptions(steps=10, max_trials=5, device="cpu")
    state = run_session(f"{IMAGE}:train_step", out, options, command="test", log=lambda m: None)
    assert state["status"] == "done"
    saved = json.loads((out / SESSION_FILE).read_text())
    assert saved["trials"] == state["trials"]
    names = [t["name"] for t in saved["trials"]]
    assert names[0] == "00-baseline" and len(names) <= 5
    for t in saved["trials"]:
        assert (out / t["folder"] / "trial.json").exists()
        assert t["decision"] in ("baseline", "kept", "reverted", "failed")
    # The loader is the bottleneck at num_workers=0: the first change tried is more workers; what was
    # kept and reverted follows from what each trial measured on this machine.
    assert saved["trials"][1]["recommendation"] == "more-workers"
    assert_decisions_follow_measurements(saved)
    assert (out / "report.html").exists()
    # The script's static findings travel with the session into its report.
    assert "dataloader-num-workers" in {f["rule"] for f in saved["lint"]}
    assert 'id="lint"' in (out / "report.html").read_text()
    check_patch_reproduces_settings(out, saved, tmp_path / "repo")


def check_patch_reproduces_settings(out: Path, saved: dict, repo: Path) -> None:
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
    result = run_trial(f"{patched}:train_step", Knobs(), repo / "trial", name="patched", steps=2, device="cpu")
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
    state = run_session(f"{TEXT}:train_step", out, SessionOptions(steps=4, max_trials=3, device="cpu"), command="test",
                        log=lambda m: None)
    assert state["status"] == "done"
    # Compute-bound: the trace's top recommendation is bf16 autocast where the CPU computes bf16 natively;
    # on a CPU without bf16 instructions (emulated bf16 is slower than fp32) it is never tried.
    tried = [t["recommendation"] for t in state["trials"][1:]]
    cpu = (state["device"] or {}).get("cpu") or {}
    if cpu.get("bf16_instructions"):
        assert tried[0] == "amp" and state["trials"][1]["knobs"]["amp"] == "bf16"
    else:
        assert "amp" not in tried and tried, tried
    assert_decisions_follow_measurements(state)


@pytest.mark.slow
def test_session_killed_and_resumed_keeps_its_trials(tmp_path):
    out = tmp_path / "session"
    cmd = [sys.executable, "-m", "advisor.cli", "profile", f"{IMAGE}:train_step", "--out", str(out),
           "--steps", "3", "--max-trials", "4", "--device", "cpu"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    # Kill the whole process group (advisor, trial, DataLoader workers) once the second trial is running.
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        session = out / SESSION_FILE
        if session.exists():
            trials = json.loads(session.read_text())["trials"]
            if len(trials) >= 1 and (out / "trials").exists() and len(list((out / "trials").iterdir())) >= 2:
                break
        time.sleep(0.2)
    else:
        pytest.fail("the session never got to its second trial")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = json.loads((out / SESSION_FILE).read_text())
    assert before["status"] == "running"
    done = [t["name"] for t in before["trials"]]
    in_flight = {p.name for p in (out / "trials").iterdir()} - set(done)
    assert in_flight, "a trial was running when the session was killed"
    resumed = subprocess.run([sys.executable, "-m", "advisor.cli", "profile", "--resume", str(out)], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    after = json.loads((out / SESSION_FILE).read_text())
    assert after["status"] == "done"
    # Finished trials are kept exactly as they were; the one in flight was redone under the same name.
    assert after["trials"][: len(done)] == before["trials"]
    names = [t["name"] for t in after["trials"]]
    assert in_flight <= set(names)
    assert sorted(p.name for p in (out / "trials").iterdir()) == sorted(names)
    assert len(names) == len(set(names))


def test_a_second_run_is_pooled_with_the_first(tmp_path):
    from advisor.session import measured

    src = SAMPLE_RUNS / "image_classifier" / "trials" / "01-workers-2"
    first, again = copy_trial(src, tmp_path / "first"), copy_trial(src, tmp_path / "again")
    sps_one, times_one = measured([first])
    sps_two, times_two = measured([first, again])
    assert sps_two == pytest.approx(sps_one)  # the same steps twice: the same rate
    assert len(times_two) == 2 * len(times_one)
    base = SAMPLE_RUNS / "image_classifier" / "trials" / "00-baseline"
    _, base_times = measured([base])
    assert median_noise(base_times, times_two) < median_noise(base_times, times_one)
    best = load_trial(copy_trial(base, tmp_path / "base"))
    keep_one = decide(best, load_trial(again), [], 0.03)
    keep_two = decide(best, load_trial(again), [], 0.03, candidate_extra=[first])
    assert keep_two[2] == pytest.approx(keep_one[2]) and keep_two[3] < keep_one[3]


def test_alternating_steps_are_measured_in_blocks(tmp_path):
    from advisor.session import lag1_autocorrelation, measured

    assert lag1_autocorrelation([0.1, 0.1, 0.1, 0.1]) == 0.0
    assert lag1_autocorrelation([0.02, 0.2, 0.03, 0.19, 0.02, 0.21]) < -0.3
    src = SAMPLE_RUNS / "image_classifier" / "trials" / "00-baseline"
    folder = copy_trial(src, tmp_path / "t")
    record = json.loads((folder / "trial.json").read_text())
    record["steps"] = [dict(record["steps"][0], recorded=True, wall_s=w, batch_size=32)
                       for w in (0.02, 0.2, 0.03, 0.19, 0.02, 0.21)]
    (folder / "trial.json").write_text(json.dumps(record))
    sps, blocks = measured([folder])
    assert sps == pytest.approx(6 * 32 / 0.67)
    assert len(blocks) == 3 and max(blocks) / min(blocks) < 1.1  # pairs even out the swing
