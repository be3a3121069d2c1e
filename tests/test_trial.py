"""Trials end to end on the CPU: real subprocesses, real torch.profiler traces, real failures."""

from __future__ import annotations

import code
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import psutil
import pytest
from conftest import whole_at
from trial_helpers import EXAMPLES, REPO, ctrl_c_reaches_it, median_trace_step, profiler_step_durations, trace_spans, \
    trial_record, write_script

import advisor
from advisor import cli
from advisor.analysis.bound import BOUNDS
from advisor.trials.knobs import APPLIED, Knobs
from advisor.trials.record import SCHEMA, load_trial
from advisor.trials.launch.processes import end_trial_processes, group_members
from advisor.trials.record import TRIAL_NODE, TRIAL_TOKEN
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec

pytestmark = pytest.mark.slow

# A step that calls a matmul and records what it saw into observed.json next to the script.
KNOB_SCRIPT = """
    import code, json, sys
    import advisor
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Trainer:
        def __init__(self):
            self.model = torch.nn.Linear(16, 16)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            self.loader = DataLoader(TensorDataset(torch.randn(256, 16)), batch_size=4, shuffle=False)

        def step(self, x):
            y = self.model(x.to("cpu"))
            loss = (y @ y.T).float().mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            l = self.loader
            with open("observed.json", "w") as f:
                json.dump({"matmul_dtype": str((x @ x.T).dtype), "argv": sys.argv[1:], "code": code.__file__,
                           "advisor": advisor.__file__,
                           "loader": [l.batch_size, l.num_workers, l.pin_memory, l.persistent_workers, l.prefetch_factor]}, f)
            return loss

    if __name__ == "__main__":
        trainer = Trainer()
        for epoch in range(100):
            for (x,) in trainer.loader:
                trainer.step(x)
"""


# Slack between the profiler's clock and the trial's perf_counter when one span is held against one timing.
CLOCK_SLACK_S = 1e-3


def check_trace_matches_trial(folder, record):
    """The recorded ProfilerStep spans are the trial's recorded steps, each span holding the step it timed
    (the span runs from one prof.step() to the next; the timing starts after the first and ends before the
    second), however busy the machine was."""
    assert record["trace_files"] and all(name.endswith(".pt.trace.json.gz") for name in record["trace_files"])
    spans = profiler_step_durations(folder / record["trace_files"][0])
    recorded = [s for s in record["steps"] if s["recorded"]]
    assert sorted(spans) == [s["index"] for s in recorded]
    for step in recorded:
        assert spans[step["index"]] >= step["wall_s"] - CLOCK_SLACK_S, (step["index"], spans, step)
    assert median_trace_step(folder) >= record["summary"]["median_step_s"] - CLOCK_SLACK_S


def check_step_times_are_consistent(record):
    """Each step's recorded parts fit inside it: the call and the wait for data are within the step's time."""
    for step in record["steps"]:
        assert 0 <= step["call_s"] <= step["wall_s"] + 1e-6, step
        assert 0 <= step["data_s"] <= step["wall_s"] + 1e-6, step
    summary = record["summary"]
    assert 0 < summary["median_call_s"] <= summary["median_step_s"] + 1e-6


def test_image_classifier_via_cli(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # as an 80-column terminal, or a pipe, gets it
    out = tmp_path / "run"
    code = cli.main(["profile", str(EXAMPLES / "image_classifier.py:train_step"), "--steps", "3", "--out", str(out),
                     "--device", "cpu", "--no-apply", "--windows", "2", "--window", "0.3", "--", "--epochs", "5"])
    assert code == 0
    output = capsys.readouterr().out
    assert "Recommendations" in output  # the baseline's diagnosis
    # Whole at 80 columns, and no progress display: the output is not a terminal.
    summary = output[output.index("Ladder"):].splitlines()  # the log lines before it are the terminal's to wrap
    assert "…" not in output, output
    whole_at(summary)
    assert "Next:" in output and "s left" not in output and "warm-up step" not in output
    # Nothing was tried, so nothing was found fastest: the way to try the recommendations instead.
    assert "no change was tried" in output and "measured fastest" not in output, output
    folder = out / "trials" / "00-baseline"
    record = trial_record(folder)
    assert record["schema"] == SCHEMA and record["status"] == "ok"
    assert record["script_args"] == ["--epochs", "5"]
    assert record["device_facts"]["cpu"]["niceness"] == os.nice(0)  # the trial runs at the advisor's priority
    check_trace_matches_trial(folder, record)
    assert record["user_values"] == {
        "batch_size": 32, "num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None,
        "threads": record["device_facts"]["cpu"]["torch_threads"],  # the script leaves torch's own default
        "fused_optimizer": False,  # it builds its optimizer as torch's default does
    }
    summary = record["summary"]
    assert summary["batch_size"] == 32 and summary["samples_per_s"] > 0 and summary["loss"] > 0
    assert abs(summary["memory_growth_per_step_bytes"]) < 2**20  # no leak
    assert summary["peak_memory_bytes"] > 0 and summary["profiler_peak_allocated_bytes"] > 0
    assert record["device_facts"]["type"] == "cpu" and record["device_facts"]["cpu"]["logical_cores"] >= 1
    check_step_times_are_consistent(record)
    # What the tool decided from what it measured: the bound it named has its advice among the recommendations.
    session = json.loads((out / "session.json").read_text())
    advised = {r["id"] for r in session["recommendations"]}
    assert session["bound"]["name"] in BOUNDS
    # The baseline's row carries the bound it was diagnosed with (it was "-" beside a line naming it).
    assert session["trials"][0]["bound"] == session["bound"]["name"]
    if session["bound"]["name"] == "input":  # the script loads on the training process (num_workers=0)
        assert "more-workers" in advised, session["recommendations"]
    assert not group_members(record["pid"])


def test_char_transformer_trial(tmp_path):
    result = run_trial(TrialSpec(f"{EXAMPLES / 'char_transformer.py'}:train_step", Knobs(), tmp_path / "t", steps=3,
                                 wait=1, device="cpu", script_args=["--context", "64"]))
    assert result.ok, result.message
    record = trial_record(result.path)
    check_trace_matches_trial(result.path, record)
    assert result.batch_size == 32 and result.loss is not None and result.median_step_s > 0
    assert load_trial(result.path) == result
    summary = record["summary"]
    # No leak: the CPU allocator's live bytes at the end of each profiled step stay put.
    assert summary["memory_growth"]["source"] == "profiler_allocated_bytes"
    assert abs(summary["memory_growth_per_step_bytes"]) < 2**20
    # The activation evidence for checkpointing: the four transformer blocks hold nearly all of it.
    blocks = next(e for e in summary["activations"]["by_class"] if e["class"] == "Block")
    assert blocks["count"] == 4 and blocks["share"] > 0.8
    assert summary["activations"]["checkpoint_candidates"][0] == "Block"
    breakdown = summary["memory_breakdown"]
    # AdamW: two moments per parameter, plus a scalar step count per parameter tensor.
    assert 2 * breakdown["parameters"] <= breakdown["optimizer_state"] < 2 * breakdown["parameters"] + 2**12
    assert breakdown["gradients"] == breakdown["parameters"]
    # `advisor analyze` reads the trial folder and its step figure agrees with the trial's own timing.
    from advisor.analysis.analyze import analyze_path, diagnosis_to_dict

    (diagnosis,) = analyze_path(result.path)
    analyzed = diagnosis_to_dict(diagnosis)
    assert analyzed["steps"]["count"] == 3 and analyzed["trial"]["status"] == "ok"
    assert analyzed["steps"]["median_ms"] / 1e3 >= result.median_step_s - CLOCK_SLACK_S  # a span holds its step


def test_knobs_reach_the_users_code_and_originals_are_recorded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # trials run in the folder they are started from; the script writes there
    script = write_script(tmp_path, KNOB_SCRIPT)
    knobs = Knobs(amp="bf16", batch_size=8, num_workers=1, persistent_workers=True, prefetch_factor=3,
                  pin_memory=True, non_blocking=True)
    result = run_trial(TrialSpec(f"{script}:Trainer.step", knobs, tmp_path / "t", steps=2, wait=1, warmup=1,
                                 script_args=["--flag"], device="cpu"))
    assert result.ok, result.message + (result.traceback or "")
    observed = json.loads((tmp_path / "observed.json").read_text())
    assert observed["matmul_dtype"] == "torch.bfloat16"
    assert observed["loader"] == [8, 1, False, True, 3]  # pin_memory is left alone on the CPU
    assert observed["argv"] == ["--flag"]
    # The trial imports this advisor, and the standard library's `code` (pdb's), not the advisor's `code`
    # subpackage: PYTHONPATH holds the folder above the package, never the package's own.
    assert observed["advisor"] == advisor.__file__ and observed["code"] == code.__file__
    assert result.batch_size == 8
    record = trial_record(result.path)
    assert record["user_values"] == {
        "batch_size": 4, "num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None,
        "threads": record["device_facts"]["cpu"]["torch_threads"], "fused_optimizer": False,
    }
    outcomes = record["knob_outcomes"]
    for knob in ("amp", "batch_size", "num_workers", "persistent_workers", "prefetch_factor"):
        assert outcomes[knob] == APPLIED
    assert outcomes["pin_memory"].startswith("not applicable")
    assert outcomes["non_blocking"].startswith("not applicable")
    assert record["knobs"] == knobs.to_dict()
    assert not group_members(record["pid"])  # the DataLoader worker is gone too


def test_target_not_found(tmp_path, capsys):
    script = write_script(tmp_path, "def train(x):\n    return x\n")
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t"))
    assert result.status == "target-not-found"
    assert "no function 'train_step' is defined (functions found: train)" in result.message
    assert trial_record(result.path)["status"] == "target-not-found"
    code = cli.main(["profile", f"{script}:train_step", "--out", str(tmp_path / "cli")])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and "target-not-found" in err
    assert cli.main(["profile", f"{tmp_path / 'missing.py'}:train_step"]) == 2
    assert "missing.py: no such file" in capsys.readouterr().err


def test_script_error_shows_the_users_traceback(tmp_path):
    script = write_script(tmp_path, """
        import torch

        def train_step(x):
            if x.shape[0] > 2:
                raise ValueError("batch too large for this model")
            return x.sum()

        if __name__ == "__main__":
            for size in range(1, 10):
                train_step(torch.ones(size))
    """)
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=5, device="cpu"))
    assert result.status == "error"
    assert result.message == "ValueError in step 2: batch too large for this model"
    assert f'File "{script}", line 6, in train_step' in result.traceback
    assert f'File "{script}", line 11, in <module>' in result.traceback
    assert "advisor" not in result.traceback.replace(str(tmp_path), "")
    assert [s["index"] for s in trial_record(result.path)["steps"]] == [0, 1]  # finished steps are kept


def test_out_of_memory_under_a_memory_cap(tmp_path):
    script = write_script(tmp_path, """
        import torch

        def train_step(step):
            size = 16 * 2**30 if step == 3 else 2**20  # the fourth step asks for 16 GiB
            return torch.ones(size, dtype=torch.uint8).sum()

        if __name__ == "__main__":
            for step in range(10):
                train_step(step)
    """)
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=3, memory_limit=6 * 2**30,
                                 device="cpu"))
    assert result.status == "oom", result.message
    assert "in step 3" in result.message and "allocate" in result.message
    record = trial_record(result.path)
    assert [s["index"] for s in record["steps"]] == [0, 1, 2] and record["memory_limit"] == 6 * 2**30
    assert not group_members(record["pid"])


def test_timeout_kills_the_trial_its_workers_and_a_child_that_left_the_process_group(tmp_path, monkeypatch,
                                                                                     trial_startup_s):
    monkeypatch.chdir(tmp_path)  # trials run in the folder they are started from; the script writes there
    script = write_script(tmp_path, """
        import subprocess, sys, time
        import torch
        from torch.utils.data import DataLoader

        def train_step(x):
            if x[0] >= 4:
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
                open("child.pid", "w").write(str(child.pid))
                time.sleep(60)
            return x.sum()

        if __name__ == "__main__":
            for x in DataLoader(list(range(100)), batch_size=2, num_workers=2):
                train_step(x)
    """)
    # Time enough to reach the step that hangs, with room for the machine growing busier than when the
    # start-up was measured (the hang lasts 60 s; the test lasts the limit).
    limit = round(3 * trial_startup_s + 6)
    started = time.monotonic()
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=5, timeout_s=limit,
                                 device="cpu"))
    assert time.monotonic() - started < limit + 12  # ended at the limit, not when the step would have
    assert result.status == "timeout" and f"time limit of {limit} s" in result.message
    record = trial_record(result.path)
    assert [s["index"] for s in record["steps"]] == [0, 1]  # it hung in step 2
    assert not group_members(record["pid"])  # the trial and its DataLoader workers
    child = int((tmp_path / "child.pid").read_text())  # and the child in a session of its own
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_ctrl_c_marks_the_trial_interrupted_and_leaves_no_processes(tmp_path, trial_startup_s):
    script = write_script(tmp_path, """
        import time
        import torch
        from torch.utils.data import DataLoader

        def train_step(x):
            if x[0] >= 2:
                time.sleep(60)
            return x.sum()

        if __name__ == "__main__":
            for x in DataLoader(list(range(100)), batch_size=2, num_workers=2):
                train_step(x)
    """)
    out = tmp_path / "run"
    advisor = subprocess.Popen([sys.executable, "-m", "advisor.cli", "profile", f"{script}:train_step",
                                "--out", str(out), "--no-apply", "--device", "cpu"], cwd=REPO,
                               preexec_fn=ctrl_c_reaches_it, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = out / "trials" / "00-baseline"
    deadline = time.monotonic() + 10 + 4 * trial_startup_s
    while not (folder / "steps.jsonl").exists() or not (folder / "steps.jsonl").read_text().strip():
        assert time.monotonic() < deadline, "the trial never started its steps"
        time.sleep(0.1)
    pid = trial_record(folder)["pid"]
    assert len(group_members(pid)) >= 3  # the trial and its two DataLoader workers
    advisor.send_signal(signal.SIGINT)
    out_text, err = advisor.communicate(timeout=60)
    assert advisor.returncode == 130, out_text + err
    record = trial_record(folder)
    assert record["status"] == "interrupted" and record["steps"][0]["index"] == 0
    assert not group_members(pid)
    os.kill(os.getpid(), 0)  # and the test process (the advisor's parent) is untouched


def test_script_that_ends_too_soon_and_a_timing_only_trial(tmp_path):
    script = write_script(tmp_path, """
        import sys

        def train_step(x):
            return float(x)

        if __name__ == "__main__":
            for x in range(int(sys.argv[1])):
                train_step(x)
    """)
    short = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "short", steps=5, script_args=["4"],
                                device="cpu"))
    assert short.status == "error"
    assert short.message == "tiny.py finished after 4 call(s) of train_step; the trial needs 8 (wait 2 + warmup 1 + record 5)"
    plain = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "plain", steps=2, script_args=["9"],
                                profile=False, device="cpu"))
    assert plain.ok and plain.loss == 4.0 and plain.steps_recorded == 2
    assert trial_record(plain.path)["trace_files"] == []


def test_a_script_that_ends_within_its_first_window_still_has_a_noise(tmp_path):
    """pytorch/examples' VAE on a small dataset: the script ended 24 steps into its first window, and each
    decision of the session read "noise 0.0%". The lone window's steps, in blocks, give its noise."""
    from advisor.trials.record.measurement import MIN_WINDOW_STEPS, measure, noise

    script = write_script(tmp_path, """
        import sys
        import torch

        model = torch.nn.Linear(64, 64)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(int(sys.argv[1])):
            optimizer.zero_grad()
            model(torch.randn(32, 64)).pow(2).mean().backward()
            optimizer.step()
    """, name="short.py")
    result = run_trial(TrialSpec(str(script), Knobs(), tmp_path / "t", steps=2, wait=0, warmup=0, device="cpu",
                                 windows=3, window_s=30.0, script_args=["40"]))
    assert result.ok, result.message
    steps = trial_record(result.path)["steps"]
    window = [s for s in steps if s.get("window") is not None]
    assert {s["window"] for s in window} == {0} and len(window) >= 2 * MIN_WINDOW_STEPS  # one window, cut short
    measured = measure([steps])
    assert measured.source == "windows" and len(measured.windows) == 1
    assert measured.relative_se is not None and noise(measured, measured) > 0


def test_two_windows_that_happen_to_agree_are_not_a_noise_of_nil():
    """A real trial whose script ended in its second window: 7270 and 7274 samples/s, a spread of ±0.03 % with one
    degree of freedom, on which the session reverted a batch of 128 as 13 % slower. Their steps, in blocks, say
    what two windows cannot: the noise is at least theirs."""
    from advisor.trials.record.measurement import measure, ratio_relative_se, window_blocks

    data = REPO / "tests" / "data" / "measurements" / "short_script_two_windows.json"
    steps = json.loads(data.read_text())["steps"]
    measured = measure([steps])
    assert measured.source == "windows" and len(measured.windows) == 2
    assert abs(measured.windows[0] / measured.windows[1] - 1) < 0.001  # the two agree by chance
    windows = [[s for s in steps if s.get("window") == w] for w in (0, 1)]
    blocks = ratio_relative_se([block for window in windows for block in window_blocks(window)])
    assert measured.relative_se == blocks > 0.005


def test_a_short_last_block_joins_the_block_before_it_and_no_block_is_lost():
    """Steps that alternate (a queue filling and draining) are read in blocks of two; an odd last step joins the
    block before it. It once replaced the first block with the joined one, the second kept twice."""
    from advisor.trials.record.measurement import MIN_WINDOW_STEPS, window_blocks, window_groups

    steps = [{"wall_s": 0.1 if i % 2 else 0.3, "batch_size": 8, "recorded": True, "index": i} for i in range(7)]
    blocks, source = window_groups(steps)
    assert source == "blocks" and [[s["index"] for s in b] for b in blocks] == [[0, 1], [2, 3], [4, 5, 6]]
    window = [{"wall_s": 0.1, "batch_size": 8}] * (MIN_WINDOW_STEPS + 1)  # two blocks, the last of one step
    assert window_blocks(window) == [(8 * (MIN_WINDOW_STEPS + 1), pytest.approx(0.1 * (MIN_WINDOW_STEPS + 1)))]


def test_a_script_that_updates_its_parameters_by_hand_is_told_to_name_its_step(tmp_path):
    """No torch.optim optimizer (pytorch/examples' word_language_model: `p.data.add_(p.grad, alpha=-lr)`): the
    trial counts no step, and says how to give it one."""
    script = write_script(tmp_path, """
        import torch

        model = torch.nn.Linear(4, 1)
        for _ in range(20):
            model.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.1)
    """, name="by_hand.py")
    result = run_trial(TrialSpec(str(script), Knobs(), tmp_path / "t", steps=1, wait=0, warmup=0, device="cpu"))
    assert result.status == "error"
    assert result.message.startswith("by_hand.py finished after 0 optimizer step(s); the trial needs ")
    assert result.message.endswith("): a step is counted at each torch.optim optimizer's step(); where the script "
                                   "updates its parameters itself, name a function that runs one training step "
                                   "(by_hand.py:FUNCTION)")


def test_a_script_that_trains_in_processes_it_starts_is_told_why_no_step_was_counted(tmp_path):
    """pytorch/examples' mnist_hogwild trains in processes of its own (`mp.Process(target=train)`), each with its
    torch.optim optimizer: the trial counted no step and told the user to name a step function, which runs in the
    children too. It says which processes the script started, and that their steps are not the trial's; the
    DataLoader's own workers are not among them."""
    script = write_script(tmp_path, """
        import multiprocessing as mp
        import torch
        from torch.utils.data import DataLoader


        def train(rank):
            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(10):
                optimizer.zero_grad()
                model(torch.randn(8, 4)).pow(2).mean().backward()
                optimizer.step()


        if __name__ == "__main__":
            list(DataLoader(range(8), num_workers=1))  # a worker of the loader's: not the script's own
            workers = [mp.get_context("fork").Process(target=train, args=(rank,)) for rank in range(2)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
    """, name="hogwild.py")
    result = run_trial(TrialSpec(str(script), Knobs(), tmp_path / "t", steps=1, wait=0, warmup=0, device="cpu"))
    assert result.status == "error"
    assert result.message.startswith("hogwild.py finished after 0 optimizer step(s); the trial needs "), result.message
    assert "; the script started 2 process(es) of its own (train): the trial counts the steps of the script's own " \
           "process, not theirs" in result.message, result.message
    assert "name a function" not in result.message


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    script = write_script(tmp_path, "def train_step(:\n")
    assert cli.main(["profile", f"{script}:train_step", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"advisor: error: {script}:1: cannot parse the script:") and "\n" not in err
    assert cli.main(["profile", f"{script}:1bad"]) == 2
    assert "is not a function name or Class.method" in capsys.readouterr().err
    assert cli.main(["profile", f"{script}:train_step", "--memory-limit", "lots"]) == 2
    assert "--memory-limit: cannot read 'lots'" in capsys.readouterr().err
    nul = tmp_path / "nul.py"
    nul.write_bytes(b"def train_step(x):\n    return x\0\n")  # refused before parsing: no file or line in the error
    assert cli.main(["profile", f"{nul}:train_step", "--out", str(tmp_path / "n")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"advisor: error: {nul}: cannot parse the script:") and "\n" not in err, err


def test_a_trial_killed_by_sigkill_counts_as_out_of_memory(tmp_path):
    # What the kernel's out-of-memory killer does to a trial that exhausts the machine's memory.
    script = write_script(tmp_path, """
        import os, signal

        def train_step(step):
            if step == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return 0.0

        if __name__ == "__main__":
            for step in range(10):
                train_step(step)
    """)
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=3, device="cpu"))
    assert result.status == "oom" and "out-of-memory killer" in result.message
    assert [s["index"] for s in trial_record(result.path)["steps"]] == [0, 1]


CRASHING = """
    import ctypes, os, sys

    def train_step(step):
        if step == 2 and not os.path.exists(sys.argv[1]):
            if sys.argv[2] == "once":
                open(sys.argv[1], "w").close()  # the next run of the trial gets past this step
            os.abort() if sys.argv[3] == "abort" else ctypes.string_at(0)  # SIGABRT, or SIGSEGV
        return 0.0

    if __name__ == "__main__":
        for step in range(10):
            train_step(step)
"""


def test_a_native_crash_runs_the_trial_once_more(tmp_path):
    script = write_script(tmp_path, CRASHING)
    marker = tmp_path / "crashed-once"
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=3, device="cpu",
                                 script_args=[str(marker), "once", "abort"]))
    assert result.ok, result.message
    record = trial_record(result.path)
    # The record says why it ran twice, and where the first run died; the crashed run's log is kept.
    [why] = record["retried_after"]
    assert why == f"the trial process crashed: Fatal Python error: Aborted in train_step ({script}, line 8)"
    assert (result.path / "output.attempt1.log").exists()
    # Its figures are the second run's alone: every step once, one trace, no crash file left.
    assert [s["index"] for s in record["steps"]] == list(range(len(record["steps"])))
    assert len(record["trace_files"]) == 1 and not (result.path / "crash.txt").exists()


def test_a_crash_on_every_run_names_the_crash_and_where_it_happened(tmp_path):
    script = write_script(tmp_path, CRASHING)
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=3, device="cpu",
                                 script_args=[str(tmp_path / "never"), "always", "segfault"]))
    assert result.status == "error"
    # Where the user's code was, and the library call that crashed inside it.
    assert result.message.startswith("the trial process crashed: Fatal Python error: Segmentation fault in "
                                     f"train_step ({script}, line 8), inside string_at (")
    record = trial_record(result.path)
    assert record["error_type"] == "NativeCrash" and len(record["retried_after"]) == 1
    assert f'File "{script}", line 8 in train_step' in (result.path / "crash.txt").read_text()
    assert [s["index"] for s in record["steps"]] == [0, 1]  # the last run's finished steps are kept


def test_device_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    script = write_script(tmp_path, "def train_step(x):\n    return x\n\nfor i in range(9):\n    train_step(i)\n")
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", device="cuda"))
    if result.ok:
        pytest.skip("this machine has a CUDA device")
    assert result.status == "error" and result.message == "--device cuda: no CUDA device is available to this process"
    assert result.traceback is None


def test_a_loop_without_a_target_has_one_span_per_step_it_timed(tmp_path):
    """No target: steps end where the optimizer steps, and the profiler starts after the first. Each
    ProfilerStep#N span is step N as trial.json timed it (the spans were one step late, the last a 0.2 ms
    stub, so every figure per step read about 20% low)."""
    script = write_script(tmp_path, """
        import time
        import torch

        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        if __name__ == "__main__":
            for i in range(1000):
                time.sleep(0.02)
                loss = model(torch.randn(4, 8)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    """)
    result = run_trial(TrialSpec(str(script), Knobs(), tmp_path / "t", steps=4, device="cpu"))
    assert result.ok, result.message
    record = trial_record(result.path)
    check_trace_matches_trial(result.path, record)
    spans = profiler_step_durations(result.path / record["trace_files"][0])
    assert min(spans.values()) >= 0.02  # every span holds a step's sleep: no stub
    from advisor.analysis.analyze import analyze_path

    (diagnosis,) = analyze_path(result.path)
    assert len(diagnosis.steps) == 4
    # The optimizer's step span holds the trial's own end of the step (torch runs its post-hooks inside: the loss
    # read, the profiler's step, in the last its stop): its update is charged up to the trial's mark only. Read
    # whole, an MLP's AdamW took 12 ms a step where it took 6 (fused "worth +95 %", measured +35 %).
    optimizer_spans = sorted(e["dur"] for e in trace_spans(result.path / record["trace_files"][0], "Optimizer.step#"))
    assert diagnosis.extra["optimizer"]["us_per_step"] < statistics.median(optimizer_spans)


def test_a_node_ends_its_own_ranks_not_those_of_another_node_on_the_same_machine():
    """Two nodes of a Ray job on one machine: their ranks carry the trial's one token. The node that finishes
    first ends its own processes only (it once ended rank 0 of the other node before it wrote its result)."""
    token = os.urandom(8).hex()

    def rank(node: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                env={**os.environ, TRIAL_TOKEN: token, TRIAL_NODE: node})

    mine, theirs = rank("0"), rank("1")
    try:
        end_trial_processes(mine.pid, token, "0")
        assert mine.wait(timeout=10) is not None and theirs.poll() is None
        end_trial_processes(theirs.pid, token)  # the whole trial: every node's
        assert theirs.wait(timeout=10) is not None
    finally:
        for process in (mine, theirs):
            process.kill()
            process.wait()


def test_the_profiler_starts_without_importing_inductor_and_traces_the_same(tmp_path):
    # torch.profiler's start asks torch for `_inductor`, which imports it (about a second of every trial);
    # ours does not, its trace holds the operators and the memory events, and torch's lazy import is put back.
    # One process: first as a trial that never compiles, then after the script has imported inductor itself.
    probe = ("import sys, torch\n"
             "from advisor.trials.harness import profiler\n"
             "x = torch.ones(64, 64)\n"
             "for case in ('plain', 'compiled'):\n"
             "    if case == 'compiled':\n"
             "        import torch._inductor\n"
             "    with profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as p:\n"
             "        (x @ x).relu().sum()\n"
             "    p.export_chrome_trace(f'{sys.argv[1]}/{case}.json')\n"
             "    print('torch._inductor' in sys.modules, torch._lazy_modules >= {'_inductor'})\n")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["False True", "True True"], out.stdout
    for case in ("plain", "compiled"):
        trace = tmp_path / f"{case}.json"
        names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
        assert {"aten::mm", "aten::relu", "aten::sum", "[memory]"} <= names, sorted(map(str, names))[:40]
