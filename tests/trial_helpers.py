"""Helpers for the trial tests: tiny scripts in tmp_path, and reading traces without advisor.analysis.trace."""

from __future__ import annotations

import gzip
import json
import statistics
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def write_script(folder: Path, body: str, name: str = "tiny.py") -> Path:
    """Write a dedented script into `folder` and return its path."""
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def trial_record(folder: Path) -> dict:
    """The trial.json of a trial folder."""
    return json.loads((folder / "trial.json").read_text())


def pair_in_turns(script: Path, folder: Path, windows: int, settle: float = 0.0, knobs: dict | None = None) -> dict:
    """Two real trials of `script` ("a" and "b", in `folder`) run at once, their windows in turns (`folder /
    "turns"`), as the session's ending runs them, each with its `knobs` by name (none: the script's own); each
    one's TrialResult by name."""
    import threading

    from advisor.trials.knobs import Knobs
    from advisor.trials.launch.runner import run_trial
    from advisor.trials.record.turns import finished, start_turns
    from advisor.trials.spec import TrialSpec

    ends = start_turns(folder / "turns", "a", "b", wait_s=30.0, settle=settle)
    results = {}

    def run(i: int, name: str) -> None:
        try:
            chosen = (knobs or {}).get(name, Knobs())
            results[name] = run_trial(TrialSpec(f"{script}:train_step", chosen, folder / name, steps=1, wait=0,
                                                warmup=0, windows=windows, window_s=0.2, device="cpu",
                                                turns=ends[i].to_dict()))
        finally:
            finished(ends[i])

    threads = [threading.Thread(target=run, args=(i, name)) for i, name in enumerate("ab")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def trace_spans(trace: Path, prefix: str) -> list[dict]:
    """The complete events of a Chrome trace (.json or .json.gz) whose name starts with `prefix`."""
    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith(prefix)]


def profiler_step_durations(trace: Path) -> dict[int, float]:
    """{N: seconds} of each `ProfilerStep#N` span in a Chrome trace (.json or .json.gz)."""
    return {int(e["name"].split("#")[1]): e["dur"] / 1e6 for e in trace_spans(trace, "ProfilerStep#")}


def median_trace_step(folder: Path) -> float:
    """Median ProfilerStep duration (seconds) over the trial's trace files."""
    durations = []
    for trace in sorted(folder.glob("*.pt.trace.json*")):
        durations += profiler_step_durations(trace).values()
    assert durations, f"no ProfilerStep spans in {folder}"
    return statistics.median(durations)


def ctrl_c_reaches_it() -> None:
    """`preexec_fn` for an advisor a test will Ctrl-C: SIGINT back to its default, so that Python turns it into
    KeyboardInterrupt. A shell starts background jobs (a CI step, `make test &`) with SIGINT ignored, and a
    child inherits that: the advisor would then never see the test's Ctrl-C."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def apply_bytes_patch(script: Path, root: Path, plan: dict, user_values: dict | None = None) -> str:
    """The uint8_copies patch that `plan` (a trial's uint8_plan) makes, applied with `patch -p1` in `root`
    (no notes left to the user); returns the patched script's text."""
    import subprocess

    from advisor.code.patch.plan import plan_patch
    from advisor.trials.knobs import Knobs

    patch = plan_patch(script, "train_step", Knobs(uint8_copies=True), user_values or {}, root=root,
                       uint8_plan=plan)
    assert not patch.notes, patch.notes
    (root / "suggested.patch").write_text(patch.diff)
    applied = subprocess.run(["patch", "-p1", "-i", "suggested.patch"], cwd=root, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    return script.read_text()


def dataloader_defaults() -> dict:
    """What DataLoader takes for each argument a loader knob sets where the script gives none: torch's own defaults,
    so that a loader knob added to the registry is in the tests that read these without being named there."""
    import inspect

    from torch.utils.data import DataLoader

    from advisor.knobs import DATALOADER_KNOBS

    return {name: inspect.signature(DataLoader).parameters[name].default for name in DATALOADER_KNOBS}
