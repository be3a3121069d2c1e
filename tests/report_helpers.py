"""Session folders for the report tests, built from REAL trial folders, and a headless Chromium runner.

`build_session` copies the recorded baseline trials of `sample_runs/` into `trials/NN-name/` folders
(trial.json + the real trace) and writes a session.json in the `advisor.session/1` schema around them. The
figures of each row are read from the copied trial's summary; `throughput` scales samples/s so that a
ladder of kept changes can be told with the same real trace standing in for each step. When a recorded
session lands in `sample_runs/` (a folder with session.json), `recorded_session()` finds it and tests can
use it instead.
"""

from __future__ import annotations

import gzip
import json
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE_RUNS = REPO / "sample_runs"
IMAGE_BASELINE = SAMPLE_RUNS / "image_classifier" / "trials" / "00-baseline"
TRANSFORMER_BASELINE = SAMPLE_RUNS / "char_transformer" / "trials" / "00-baseline"
TRACES = REPO / "tests" / "data" / "traces"


@dataclass(frozen=True)
class LadderRow:
    """One row of a fixture session: which real trial folder stands in for it, and the decision taken."""

    name: str
    change: str
    decision: str  # baseline | kept | reverted | failed
    source: Path = IMAGE_BASELINE
    knobs: dict | None = None
    recommendation: str | None = None
    throughput: float = 1.0  # factor on the real trial's samples/s
    status: str = "ok"
    reason: str = ""
    measured: bool = True  # False: the trial failed (e.g. OOM) before recording steps; no trace, no figures


DEFAULT_LADDER = (
    LadderRow("00-baseline", "baseline", "baseline", reason="the script as written"),
    LadderRow("01-more-workers", "num_workers 0 → 2", "kept", knobs={"num_workers": 2},
              recommendation="more-workers", throughput=1.8, reason="samples/s +80.0% (noise 3.0%)"),
    LadderRow("02-amp-bf16", "amp bf16", "reverted", source=TRANSFORMER_BASELINE,
              knobs={"num_workers": 2, "amp": "bf16"}, recommendation="amp", throughput=1.75,
              reason="samples/s -2.8% against 01-more-workers, within noise"),
    LadderRow("03-batch-64", "batch_size 32 → 64", "kept", knobs={"num_workers": 2, "batch_size": 64},
              recommendation="larger-batch", throughput=2.1, reason="samples/s +16.7% (noise 3.0%)"),
    LadderRow("04-batch-128", "batch_size 64 → 128", "failed", knobs={"num_workers": 2, "batch_size": 128},
              recommendation="larger-batch", status="oom", reason="out of memory at batch 128",
              measured=False),
)


def recorded_session() -> Path | None:
    """A real recorded session under sample_runs/ (a folder with session.json), if one is there."""
    found = sorted(SAMPLE_RUNS.glob("*/session.json"))
    return found[0].parent if found else None


def _knobs(overrides: dict | None) -> dict:
    knobs = {k: None for k in ("amp", "batch_size", "num_workers", "pin_memory", "persistent_workers",
                               "prefetch_factor", "non_blocking")}
    knobs.update(overrides or {})
    return knobs


def build_session(dst: Path, specs: tuple[LadderRow, ...] | list[LadderRow] = DEFAULT_LADDER,
                  patch: str | None = None) -> Path:
    """A session folder at `dst` from real trial folders, with session.json per the schema."""
    dst.mkdir(parents=True, exist_ok=True)
    rows = []
    base_sps = None
    for index, spec in enumerate(specs):
        folder = dst / "trials" / spec.name
        shutil.copytree(spec.source, folder)
        trial = json.loads((folder / "trial.json").read_text())
        trial["name"] = spec.name
        trial["knobs"] = _knobs(spec.knobs)
        (folder / "trial.json").write_text(json.dumps(trial, indent=2))
        if not spec.measured:
            for trace in folder.glob("*.pt.trace.json*"):
                trace.unlink()
            trial["trace_files"] = []
            (folder / "trial.json").write_text(json.dumps(trial, indent=2))
        summary = trial["summary"]
        base_sps = base_sps or summary["samples_per_s"]
        sps = base_sps * spec.throughput
        batch_size = (spec.knobs or {}).get("batch_size") or summary["batch_size"]
        rows.append({
            "index": index, "name": spec.name, "folder": f"trials/{spec.name}", "change": spec.change,
            "recommendation": spec.recommendation, "knobs": trial["knobs"], "status": spec.status,
            "decision": spec.decision, "reason": spec.reason, "batch_size": batch_size,
            "median_step_s": batch_size / sps, "samples_per_s": sps,
            "peak_memory_bytes": summary["peak_memory_bytes"], "peak_memory_source": summary["peak_memory_source"],
            "capacity_bytes": trial["device_facts"].get("cpu", {}).get("ram_bytes"), "loss": summary["loss"],
            "speedup": sps / base_sps, "gain": 1 - base_sps / sps, "predicted_gain": None if index == 0 else 0.3,
            "noise": 0.03,
        })
        if not spec.measured:
            rows[-1].update({k: None for k in ("median_step_s", "samples_per_s", "peak_memory_bytes", "loss",
                                                "speedup", "gain", "noise")})
    kept = [r for r in rows if r["decision"] in ("baseline", "kept")]
    best = max(kept, key=lambda r: r["samples_per_s"])
    baseline_trial = json.loads((dst / "trials" / specs[0].name / "trial.json").read_text())
    if patch is not None:
        (dst / "suggested.patch").write_text(patch)
    session = {
        "schema": "advisor.session/1", "target": "examples/image_classifier.py:train_step",
        "script": baseline_trial["script"],
        "command": f"advisor profile examples/image_classifier.py:train_step --out {dst}",
        "options": {"steps": 3, "device": "auto", "max_trials": 8, "time_budget_s": None,
                    "keep_effective_batch": False, "memory_limit": None},
        "status": "done", "started_at": time.time() - 60, "updated_at": time.time(),
        "device": baseline_trial["device_facts"], "user_values": baseline_trial["user_values"],
        "baseline": specs[0].name, "best": best["name"], "final_knobs": best["knobs"], "trials": rows,
        "recommendations": [{
            "id": "amp", "title": "Autocast matmuls and convolutions to bf16 (CPU AMP)", "knobs": {"amp": "bf16"},
            "predicted_gain": 0.05, "evidence": ["4.5% of the step is in matmul/convolution operators"],
            "code_change": "with torch.autocast('cpu', dtype=torch.bfloat16):\n    loss = loss_fn(model(x), y)",
            "caveat": "", "details": {}}],
        "notes": ["The batch grew from 32 to 64 (×2): scale the learning rate by about ×2"],
        "patch": "suggested.patch" if patch is not None else None,
        "speedup": best["speedup"],
    }
    (dst / "session.json").write_text(json.dumps(session, indent=2))
    return dst


def ten_trial_specs() -> list[LadderRow]:
    """A 10-trial session: baseline, then kept and reverted steps alternating."""
    specs = [DEFAULT_LADDER[0]]
    for i in range(1, 10):
        kept = i % 2 == 1
        specs.append(LadderRow(f"{i:02d}-step-{i}", f"num_workers {i - 1} → {i}", "kept" if kept else "reverted",
                               source=IMAGE_BASELINE if kept else TRANSFORMER_BASELINE,
                               knobs={"num_workers": i}, recommendation="more-workers",
                               throughput=1 + 0.2 * i, reason="measured"))
    return specs


def rewrite_trace_names(src: Path, dst: Path, payloads: tuple[str, ...]) -> Path:
    """A copy of a real trace with every kernel and operator name (and device name) carrying `payloads`."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    rewritten = 0
    for e in doc["traceEvents"]:
        cat = str(e.get("cat", "")).lower()
        if cat in ("kernel", "cpu_op", "operator") and "name" in e:
            e["name"] = f"{payloads[rewritten % len(payloads)]}{e['name']}"  # each payload on every kind
            rewritten += 1
    for dev in doc.get("deviceProperties") or []:
        dev["name"] = f"{payloads[-1]}{dev.get('name', '')}"
    # Written whole and compressed at level 1: json.dump into a gzip stream at its default level 9 took over a
    # second for a 30 MB trace; the readers take either alike.
    dst.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    return dst


# ---- headless Chromium ----

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage")


def chromium() -> str | None:
    """The chromium executable, or None when it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def run_chromium(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run headless chromium with a throw-away profile and the given arguments."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
