"""Faults a hostile but fair user meets with sessions: non-finite losses, folders that are not what
session.json says, kills and restarts, two runs at once, Ctrl-C twice, daemons that outlive a trial, bad
arguments. Each ends with a clear error or a finished record and report; nothing outside is touched."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from trial_helpers import ctrl_c_reaches_it, trial_record, write_script

from advisor import cli
from advisor.trials.knobs import Knobs
from advisor.search.state import SessionOptions
from advisor.search.session import run_session
from advisor.search.strategy import SearchSpace
from advisor.trials.record import TRIAL_TOKEN
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from conftest import ROOT, advisor_main

pytestmark = pytest.mark.slow

TINY = """
    import sys, time
    import torch
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step(x):
        time.sleep(SLEEP)
        loss = model(x).pow(2).mean()
        if NAN_ABOVE is not None and x.shape[0] > NAN_ABOVE:
            loss = loss * float("nan")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    if __name__ == "__main__":
        for epoch in range(10_000):
            for x in DataLoader(torch.randn(256, 8), batch_size=8):
                train_step(x)
"""


def tiny(folder: Path, nan_above: int | None = None, sleep: float = 0.0) -> Path:
    return write_script(folder, TINY.replace("NAN_ABOVE", repr(nan_above)).replace("SLEEP", repr(sleep)))


def strict_json(path: Path) -> dict:
    """The record, read by a reader that refuses NaN and Infinity (as msgspec and other languages do)."""
    def refuse(constant):
        raise ValueError(f"{path}: {constant} is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


# torch.compile left out: these sessions are about faults, and a compile is 5 s of each trial that tries it.
QUICK = SessionOptions(steps=2, wait=1, warmup=0, device="cpu", windows=1, window_s=0.1, max_trials=5, skip=("compile",))


def test_a_nan_loss_baseline_ends_with_a_report(tmp_path):
    out = tmp_path / "session"
    # Two trials: the baseline, and one change measured after it (its loss is as non-finite).
    state = run_session(f"{tiny(tmp_path, nan_above=0)}:train_step", out, dataclasses.replace(QUICK, max_trials=2),
                        log=lambda m: None)
    assert state["status"] == "done" and state["trials"][0]["decision"] == "baseline"
    saved = strict_json(out / "session.json")
    assert saved["trials"][0]["loss"] is None and saved["trials"][0]["non_finite"]["loss"] == "nan"
    assert any("not finite" in note for note in saved["notes"])
    record = strict_json(out / "trials" / "00-baseline" / "trial.json")
    assert all(s["non_finite"]["loss"] == "nan" for s in record["steps"])
    assert (out / "report.html").is_file()
    assert advisor_main("report", str(out), "-o", str(tmp_path / "again.html")).returncode == 0
    assert advisor_main("analyze", str(out / "trials" / "00-baseline")).returncode == 0


def test_a_nan_loss_in_a_later_trial_is_reverted_and_the_session_reports(tmp_path):
    out = tmp_path / "session"
    # Only the batch may change: which other change a busy machine measures first is not what this tests.
    batch_only = SearchSpace(held={"num_workers": (0,), "amp": (), "pin_memory": ()}, model_knobs=())
    state = run_session(f"{tiny(tmp_path, nan_above=8)}:train_step", out, dataclasses.replace(QUICK, max_trials=3),
                        log=lambda m: None, space=batch_only)
    assert state["status"] == "done" and (out / "report.html").is_file()
    strict_json(out / "session.json")
    larger = [t for t in state["trials"] if (t.get("batch_size") or 0) > 8]
    assert larger, [(t["change"], t["decision"]) for t in state["trials"]]  # the round tried a larger batch
    assert all(t["decision"] == "reverted" and "not finite" in t["reason"] for t in larger)


def one_trial_session(tmp_path: Path) -> Path:
    out = tmp_path / "session"
    options = SessionOptions(steps=1, wait=1, warmup=0, device="cpu", windows=0, max_trials=1)
    run_session(f"{tiny(tmp_path)}:train_step", out, options, log=lambda m: None)
    return out


def test_resume_moves_aside_what_it_did_not_make_and_leaves_a_linked_trials_alone(tmp_path):
    out = one_trial_session(tmp_path)
    stranger = out / "trials" / "notes-of-mine"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("mine")
    done = advisor_main("profile", "--resume", str(out))
    assert done.returncode == 0, done.stderr
    assert (out / "trials" / ".set-aside" / "notes-of-mine" / "keep.txt").read_text() == "mine"
    # trials/ as a link to a folder outside: refused, and nothing there is touched.
    outside = tmp_path / "outside"
    (outside / "precious").mkdir(parents=True)
    (out / "trials").rename(tmp_path / "moved-trials")
    (out / "trials").symlink_to(outside)
    done = advisor_main("profile", "--resume", str(out))
    assert done.returncode == 2 and "symbolic link" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]


def wait_for_steps(folder: Path, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while not (folder / "steps.jsonl").exists() or not (folder / "steps.jsonl").read_text().strip():
        assert time.monotonic() < deadline, f"no step in {folder}"
        time.sleep(0.1)


# TINY, but the second process to run it (the session's second trial) hangs from its third step on: it is in its
# steps when the advisor is killed, however slow the machine, and the third (the resume's run of it) runs through.
SECOND_HANGS = TINY.replace("    torch.manual_seed(0)\n", """    torch.manual_seed(0)
    import os
    with open(STARTS, "a") as f:  # one character for each trial process that runs the script
        f.write("x")
    second = os.path.getsize(STARTS) == 2
    calls = []
""").replace("        time.sleep(SLEEP)\n", """        calls.append(1)
        if second and len(calls) > 2:
            time.sleep(60)
""").replace("NAN_ABOVE", "None")


def test_sigkill_of_the_advisor_mid_trial_then_resume_leaves_nothing_behind(tmp_path, trial_startup_s):
    script = write_script(tmp_path, SECOND_HANGS.replace("STARTS", repr(str(tmp_path / "starts"))))
    out = tmp_path / "session"
    advisor = subprocess.Popen([sys.executable, "-m", "advisor.cli", "profile", f"{script}:train_step", "--out",
                                str(out), "--device", "cpu", "--steps", "3", "--windows", "0", "--max-trials", "2",
                                "--skip", "compile"],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Wait for the second trial's steps (it hangs in its third): the baseline is finished and recorded by then.
    deadline = time.monotonic() + 20 + 8 * trial_startup_s
    while True:
        assert time.monotonic() < deadline, "the session never got to its second trial"
        running = json.loads((out / "session.json").read_text()).get("running_trial") if (out / "session.json").exists() else None
        steps = out / "trials" / running["name"] / "steps.jsonl" if running else None
        if running and running["name"].startswith("01-") and steps.exists() and steps.read_text().strip():
            break
        time.sleep(0.1)
    before = json.loads((out / "session.json").read_text())
    advisor.kill()  # the advisor alone: its trial must not run on unsupervised
    advisor.wait()
    deadline = time.monotonic() + 30  # DataLoader workers notice a dead parent on a 5 s poll
    while time.monotonic() < deadline and trial_left(running["token"]):
        time.sleep(0.2)
    assert not trial_left(running["token"]), "the trial outlived the advisor that started it"
    done = advisor_main("profile", "--resume", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    after = json.loads((out / "session.json").read_text())
    assert after["status"] == "done" and after["running_trial"] is None
    # Finished trials are kept as they were; the one in flight was run again under the same name.
    assert after["trials"][: len(before["trials"])] == before["trials"]
    names = [t["name"] for t in after["trials"]]
    assert running["name"] in names and len(names) == len(set(names))
    assert sorted(p.name for p in (out / "trials").iterdir()) == sorted([*names, "session"])  # + TensorBoard's run
    assert not trial_left(running["token"])


def trial_left(token: str) -> list[int]:
    left = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(TRIAL_TOKEN) == token:
                left.append(proc.pid)
        except psutil.Error:
            continue
    return left


def test_two_sessions_in_one_folder_at_once_one_refuses(tmp_path):
    script = tiny(tmp_path, sleep=0.05)
    out = tmp_path / "session"
    command = [sys.executable, "-m", "advisor.cli", "profile", f"{script}:train_step", "--out", str(out), "--device",
               "cpu", "--no-apply", "--windows", "0"]
    first = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = [(p.wait(timeout=300), p.communicate()) for p in (first, second)]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, (_, err) in results if code == 2)
    assert "a session is running there" in refused and len(refused.strip().splitlines()) == 1
    assert json.loads((out / "session.json").read_text())["status"] == "done"


def test_ctrl_c_twice_still_finishes_the_trial_record(tmp_path, trial_startup_s):
    script = tiny(tmp_path, sleep=0.2)
    out = tmp_path / "session"
    advisor = subprocess.Popen([sys.executable, "-m", "advisor.cli", "profile", f"{script}:train_step", "--out",
                                str(out), "--device", "cpu", "--steps", "50"], cwd=ROOT, preexec_fn=ctrl_c_reaches_it,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    folder = out / "trials" / "00-baseline"
    wait_for_steps(folder, 10 + 4 * trial_startup_s)
    advisor.send_signal(signal.SIGINT)
    time.sleep(0.05)
    advisor.send_signal(signal.SIGINT)
    advisor.wait(timeout=60)
    assert advisor.returncode == 130
    assert trial_record(folder)["status"] == "interrupted"
    assert json.loads((out / "session.json").read_text())["status"] == "interrupted"


def test_a_daemon_that_ignores_sigterm_does_not_outlive_its_trial(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # trials run in the folder they are started from; the script writes there
    script = write_script(tmp_path, """
        import os, signal, time

        def train_step(x):
            if x == 2 and os.fork() == 0:  # a daemon: fork, new session, fork again, ignore SIGTERM
                os.setsid()
                daemon = os.fork()
                if daemon == 0:
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                    time.sleep(120)
                    os._exit(0)
                open("daemon.pid.tmp", "w").write(str(daemon))
                os.rename("daemon.pid.tmp", "daemon.pid")
                os._exit(0)
            while x == 2 and not os.path.exists("daemon.pid"):  # however slow the machine, the daemon is there
                time.sleep(0.01)
            return 0.0

        if __name__ == "__main__":
            for x in range(100):
                train_step(x)
                time.sleep(0.05)
    """)
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=4, device="cpu"))
    assert result.ok, result.message
    daemon = int((tmp_path / "daemon.pid").read_text())
    assert not psutil.pid_exists(daemon) or psutil.Process(daemon).status() == psutil.STATUS_ZOMBIE


def test_a_syntax_error_ends_the_session_as_failed(tmp_path, capsys):
    script = write_script(tmp_path, "def train_step(x:\n    return x\n")
    out = tmp_path / "session"
    assert cli.main(["profile", f"{script}:train_step", "--out", str(out), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot parse the script" in err and len(err.splitlines()) == 1
    state = json.loads((out / "session.json").read_text())
    assert state["status"] == "failed" and (out / "report.html").is_file()


@pytest.mark.parametrize("flags, problem", [
    (["--timeout", "nan"], "--timeout: must be a positive number of seconds"),
    (["--memory-limit", "inf"], "--memory-limit: cannot read 'inf'"),
    (["--window", "-1"], "--window: must be a positive number of seconds"),
    (["--max-trials", "0"], "--max-trials: must be at least 1"),
])
def test_bad_numbers_are_one_line_errors(tmp_path, capsys, flags, problem):
    script = tiny(tmp_path)
    assert cli.main(["profile", str(script), "--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert problem in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


# --- a session's folder on every path ---------------------------------------------------------------

def test_resuming_a_finished_session_says_it_is_done_and_changes_nothing(tmp_path):
    out = one_trial_session(tmp_path)
    before = (out / "session.json").read_bytes()
    for _ in range(2):
        done = advisor_main("profile", "--resume", str(out))
        assert done.returncode == 0, done.stderr
        assert f"{out}: this session is done (1 trial(s), best 00-baseline); nothing to resume" in done.stdout
    assert (out / "session.json").read_bytes() == before  # no stop note appended again


def test_resume_of_a_folder_without_a_session_fails_in_one_line_and_leaves_nothing(tmp_path):
    missing = tmp_path / "no-such-session"
    done = advisor_main("profile", "--resume", str(missing))
    assert done.returncode == 2 and "no such folder" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not missing.exists()
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    tiny(scripts)
    done = advisor_main("profile", "--resume", str(scripts))
    assert done.returncode == 2 and "not a session folder" in done.stderr, done.stderr
    assert sorted(p.name for p in scripts.iterdir()) == ["tiny.py"]  # no lock left behind
    done = advisor_main("profile", str(scripts), "--device", "cpu")
    assert done.returncode == 2 and f"{scripts}: is a folder, not a script" in done.stderr, done.stderr


def test_a_session_interrupted_writes_its_report_and_resumes_from_another_folder(tmp_path, trial_startup_s):
    """Started from one working folder with a relative script path, Ctrl-C during the second trial (a report
    of what was measured), resumed from another working folder: it finds its script and finishes."""
    (tmp_path / "work").mkdir()
    tiny(tmp_path / "work", sleep=0.05)
    out = tmp_path / "session"
    advisor = subprocess.Popen([sys.executable, "-m", "advisor.cli", "profile", "tiny.py:train_step", "--out",
                                str(out), "--device", "cpu", "--steps", "2", "--windows", "0", "--max-trials", "2",
                                "--skip", "compile"],
                               cwd=tmp_path / "work", preexec_fn=ctrl_c_reaches_it,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30 + 8 * trial_startup_s
    while not any((out / "trials").glob("01-*/steps.jsonl")):
        assert advisor.poll() is None, advisor.communicate()
        assert time.monotonic() < deadline, "the session never got to its second trial"
        time.sleep(0.05)
    advisor.send_signal(signal.SIGINT)
    _, err = advisor.communicate(timeout=120)
    assert advisor.returncode == 130, err
    state = json.loads((out / "session.json").read_text())
    assert state["status"] == "interrupted" and (out / "report.html").is_file()
    assert Path(state["target"]).is_absolute() or Path(state["target"].rpartition(":")[0]).is_absolute()
    done = advisor_main("profile", "--resume", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "no such file" not in done.stdout + done.stderr
    assert json.loads((out / "session.json").read_text())["status"] == "done"


def test_a_missing_import_names_the_interpreter_and_doctor_finds_it(tmp_path, capsys):
    # A dependency the advisor's interpreter lacks: the baseline fails at the import, and the one line says
    # which Python ran the trial and where the advisor belongs; `advisor doctor SCRIPT` finds the module first.
    script = write_script(tmp_path, """
        import os
        import torch
        import helper_beside_it
        try:
            import an_optional_accelerator
        except ImportError:
            an_optional_accelerator = None
        from a_module_nobody_installed.sub import thing
    """)
    (tmp_path / "helper_beside_it.py").write_text("")
    out = tmp_path / "session"
    assert cli.main(["profile", str(script), "--out", str(out), "--device", "cpu", "--max-trials", "1"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "ModuleNotFoundError: No module named 'a_module_nobody_installed'" in line, line
    assert f"the trial ran under {sys.executable}" in line and "advisor doctor" in line, line

    from advisor.doctor.imports import imports_check

    check = imports_check(script)
    assert check.status == "failed" and check.needed, check
    assert check.details["imports"] == ["os", "torch", "helper_beside_it", "an_optional_accelerator",
                                        "a_module_nobody_installed"]
    assert check.details["missing"] == ["a_module_nobody_installed"]
    assert check.details["missing_optional"] == ["an_optional_accelerator"]
    assert "a_module_nobody_installed (line 9)" in check.summary and sys.executable in check.summary
