"""Shared test fixtures: where the real recorded traces are, and how to run the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces" / "gpu"
SAMPLE_RUNS = ROOT / "sample_runs"


def gpu_trace(name: str) -> Path:
    """A real recorded GPU trace from ../shared/traces/gpu, or skip the test with the reason."""
    path = SHARED_TRACES / name
    if not path.exists():
        pytest.skip(f"{path} is absent: the real GPU traces live in ../shared/traces beside the checkout")
    return path


def run_advisor(*args: str, cwd: Path | None = None, timeout: float = 120, env: dict | None = None,
                ) -> subprocess.CompletedProcess:
    """Run `python -m advisor.cli ARGS` as a real process and capture its output."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "advisor.cli", *args], cwd=cwd or ROOT, capture_output=True,
                          text=True, timeout=timeout, env=full_env)
