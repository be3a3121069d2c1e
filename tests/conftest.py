"""Shared test fixtures: where the real recorded traces are, and how to run the real CLI."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Terminal output of the CLI is checked as text: a wide terminal, so that a long temporary path (longer
# still under pytest-xdist) never wraps in the middle of what a test looks for.
os.environ["COLUMNS"] = "250"
# The suite's workers share the cores, and each trial's torch runs as many OpenMP threads as there are
# cores. OpenMP threads that spin while they wait take the cores from another worker's trial: a char
# transformer trial measured 4.3 samples/s beside a busy torch process, 57.6 when both wait passively (103.7
# alone). Set before torch is imported, inherited by every trial.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# A trial that compiles would start inductor's pool of compile workers: a side process and a worker per core,
# each importing torch, where the other test worker already has the second core (the conv session and the
# model-knob tests: 57 CPU-s with the pool, 44 without). The trials' kernels compile in their own process, as
# TORCHINDUCTOR_COMPILE_THREADS=1 has them; what a trial records of its compile is the same.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# Inductor writes its cache folder into the environment where it first looks it up: once a test's in-process
# work did (the timm test's), the module's later trials differed from the earlier ones by that variable and
# got a zygote of their own. Set from the start, to the folder inductor would choose.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"))
# No test downloads from a hub (none is reachable): the Hugging Face libraries are told so. Set for the whole suite,
# not by the frameworks' module: a variable that differs between modules gives the trials a zygote of its own.
os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"
# A session record that does not fit its types (advisor.search.record) fails the test that saved it, in this
# process and in every advisor the suite starts; a user gets a warning and the session goes on.
os.environ["ADVISOR_STRICT_RECORD"] = "1"
DATA = ROOT / "tests" / "data"
TRACES = DATA / "traces"  # real GPU traces (tests/data/README.md says where each came from)
SURFACES = DATA / "surfaces"  # recorded response surfaces, replayed by the search tests
SAMPLE_RUNS = ROOT / "sample_runs"


def gpu_trace(name: str) -> Path:
    """A real recorded GPU trace from tests/data/traces (it is in the repository: a missing one fails)."""
    path = TRACES / name
    assert path.is_file(), f"{path} is missing from the repository"
    return path


def run_advisor(*args: str, cwd: Path | None = None, timeout: float = 120, env: dict | None = None,
                ) -> subprocess.CompletedProcess:
    """Run `python -m advisor.cli ARGS` as a real process and capture its output."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "advisor.cli", *args], cwd=cwd or ROOT, capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def advisor_main(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`advisor ARGS` as the console script runs it (`advisor.cli.main`), in this process, its output
    captured: for tests of what the command does rather than of its process (exit codes of a killed or
    interrupted advisor, imports, stray processes), which `run_advisor` runs. This process's trials are forked
    from its own zygote (advisor.trials.launch.zygote), which a new process would start again."""
    import contextlib
    import io

    from advisor import cli

    # Text streams over bytes, as a process's are: `--json` writes its bytes to sys.stdout.buffer.
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in range(2))
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.update(env or {})
    os.chdir(cwd or ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    text = [stream.buffer.getvalue().decode("utf-8", "replace") for stream in (out, err)]
    return subprocess.CompletedProcess(["advisor", *args], code, *text)


def trial_environment() -> dict[str, str]:
    """A CPU trial's environment, with a token of its own: a process started with it is forked from the zygote
    this worker's trials fork from (another environment would start a zygote of its own)."""
    import uuid

    from advisor.trials.launch.runner import child_environment

    return child_environment(None, "cpu", uuid.uuid4().hex)


def run_script(script: Path | str, *args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` run from `cwd` on the CPU, as a user runs a script a patch changed: forked from this
    worker's zygote, as its trials are (torch and dynamo imported already: 4 s less CPU than a fresh Python on
    this machine), else a fresh process. stdout and stderr come together, in both fields. The child finds
    `tests.as_script` where its trials find the advisor: in the checkout, whose tests/ is beside the package."""
    import signal

    from advisor.trials.launch.zygote import start_trial

    env = trial_environment()  # a trial's: it finds the trials' zygote
    command = [str(script), *args]
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "output.log"
        child = start_trial(sys.executable, None, str(cwd), env, str(log), timeout,
                            module=["tests.as_script", *command])
        if child is None:  # another trial in flight, or no zygote here
            done = subprocess.run([sys.executable, *command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=timeout)
            code, text = done.returncode, done.stdout
        else:
            try:
                code = child.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                raise
            text = log.read_text(errors="replace")
    return subprocess.CompletedProcess([sys.executable, *command], code, text, text)


# The test files that take longest, longest first (the sum of each file's test durations in a `make test` of this
# checkout on a machine loaded by other work, load average 9-11, 18:51 in all: the API's notebooks and OOM session
# 168 s, doctor 151, Ray 114, the faults 109, ... the wheel 24); the rest follow in alphabetical order. The workers
# take files in this order as each runs short (`--no-loadscope-reorder`), so the last files to start are short and
# the workers end together: a file left to the alphabetical tail (the wheel's build, the trace budget's sessions)
# ran while the other worker had finished. xdist's own order, by number of tests, put the files of one or two real
# sessions last. Ray goes first: its idle waits (time limits, a node's health checks) leave the other worker the cores.
LONGEST_FIRST = ("test_ray.py", "test_api.py", "test_doctor.py", "test_faults.py", "test_analyze_fuzz.py",
                 "test_trial.py", "test_analyze_advice.py", "test_zygote.py", "test_report.py", "test_proposals.py",
                 "test_steering.py", "test_conv_session.py", "test_session.py", "test_distributed.py", "test_turns.py",
                 "test_own_settings.py", "test_search.py", "test_checkpointing.py", "test_patch_style.py",
                 "test_model_knobs.py", "test_patch.py", "test_drift.py", "test_trace_budget.py",
                 "test_uint8_transforms.py", "test_compare.py", "test_frameworks.py", "test_analyze_hostile.py",
                 "test_analyze_cpu_runs.py", "test_memory_advice.py", "test_wheel.py", "test_memory.py",
                 "test_scripts.py", "test_truth_surfaces.py", "test_gpt_session.py", "test_analyze_gpu_traces.py",
                 "test_uint8_copies.py", "test_analyze_inputs.py", "test_expected.py", "test_report_hostile.py",
                 "test_docs.py", "test_whatif.py")


def pytest_collection_modifyitems(items: list) -> None:
    """Files in the order of LONGEST_FIRST, then the others; each file's tests as written."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="module", autouse=True)
def environment_as_it_was():
    """Each module leaves the environment as it found it: what its in-process work wrote there (ray.init's
    RAY_* and PYTHONBREAKPOINT, inductor's TORCHINDUCTOR_CACHE_DIR) would otherwise reach the next module's
    trials, and give each of them a zygote of its own (one per environment)."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture(scope="session")
def trial_startup_s(tmp_path_factory) -> float:
    """Seconds a trivial trial with two DataLoader workers takes here, start to finish: time limits in tests
    are set from it, so that a slow or busy machine gets proportionally more time."""
    from advisor.trials.knobs import Knobs
    from advisor.trials.launch.runner import run_trial
    from advisor.trials.spec import TrialSpec

    folder = tmp_path_factory.mktemp("startup")
    script = folder / "trivial.py"
    script.write_text("import torch\nfrom torch.utils.data import DataLoader\n\ndef train_step(x):\n"
                      "    return x.sum()\n\nif __name__ == '__main__':\n"
                      "    for x in DataLoader(list(range(100)), batch_size=2, num_workers=2):\n"
                      "        train_step(x)\n")
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), folder / "t", steps=2, device="cpu"))
    assert result.ok, result.message
    return json.loads((result.path / "trial.json").read_text())["times"]["duration_s"]


def whole_at(lines: list[str], width: int = 80) -> None:
    """Terminal output readable at `width` columns: nothing cut with '…', and every line within the width but
    the copyable ones (a path or a command, printed whole on a line of its own so it can be pasted)."""
    from rich.cells import cell_len

    for line in lines:
        assert "…" not in line, line
        text = line.strip()
        copyable = " " not in text or text.startswith(("cd ", "patch -p1"))
        assert copyable or cell_len(line) <= width, line


# ---- what some tests need from the machine ----------------------------------------------------------------
# Tests that need a program the README's set-up does not install skip with a one-line reason where it is
# missing (never in CI: .ci/run installs them), and the summary at the end says how to get them.

TOOLS = {  # program: (the reason's words, how to get it)
    "chromium": ("needs Chromium (headless, to render the report)", "apt-get install -y chromium"),
    "patch": ("needs GNU patch (to apply suggested.patch)", "apt-get install -y patch"),
}
CUDA = ("needs a CUDA device", "on a GPU machine: make gpu-check")


def tool_path(tool: str) -> str | None:
    """Where `tool` is on the PATH (Chromium under either of its names)."""
    import shutil

    return shutil.which(tool) or (shutil.which("chromium-browser") if tool == "chromium" else None)


def require(tool: str) -> str:
    """The program's path; skip the test (fail it in CI) where it is not on the PATH."""
    found = tool_path(tool)
    if found is None:
        words, _ = TOOLS[tool]
        if os.environ.get("CI"):
            pytest.fail(f"{words}, and CI must run every test (.ci/run installs it)")
        pytest.skip(f"{words}: {tool} is not on the PATH")
    return found


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """What was skipped, by what it needs, and how to get it (one line each)."""
    counts: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        counts[reason] = counts.get(reason, 0) + 1
    if not counts:
        return
    how = {words: fix for words, fix in [*TOOLS.values(), CUDA]}
    terminalreporter.section("skipped, and how to run them", sep="-")
    for reason, count in sorted(counts.items(), key=lambda item: -item[1]):
        fix = next((fix for words, fix in how.items() if reason.startswith(words)), None)
        terminalreporter.write_line(f"{count:4d} {reason}" + (f" -> {fix}" if fix else ""))
    if any(reason.startswith(words) for reason in counts for words, _ in TOOLS.values()):
        terminalreporter.write_line("     .ci/run installs Chromium and patch, and fails a test that would skip for "
                                    "want of them")
