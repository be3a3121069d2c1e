"""Real training scripts as they are written, profiled with no target and no edit: a GPT trainer whose loop
is `Trainer.run` in an imported package with the batch size in a config, a per-epoch `train()` function,
an L-BFGS closure loop with no DataLoader, and an inline loop with a training and an evaluation loader
whose batch sizes come from flags (tests/scripts/). The tool stops each, finds the training loader and
its batch, and writes a patch that `git apply` accepts and that changes only the training setting, where
it is set."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from trial_helpers import trial_record, write_script

from advisor.analysis.analyze import analyze_file
from advisor.trials.knobs import APPLIED, Knobs
from advisor.code.patch import PATCH_NAME, write_patch
from advisor.search.outputs import step_function
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from records import record
from conftest import ROOT, advisor_main

pytestmark = pytest.mark.slow
SCRIPTS = ROOT / "tests" / "scripts"
QUICK = ("--device", "cpu", "--steps", "2", "--windows", "0", "--no-apply")


def repository(tmp_path: Path) -> Path:
    """A git repository holding a copy of the test scripts, as a user's checkout would."""
    repo = tmp_path / "repo"
    shutil.copytree(SCRIPTS, repo, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "scripts"], cwd=repo,
                   check=True)
    return repo


def baseline(repo: Path, script: str, tmp_path: Path, *script_args: str) -> dict:
    """`advisor profile SCRIPT --no-apply` with no target, through the real CLI: the session record."""
    out = tmp_path / "session"
    done = advisor_main("profile", str(repo / script), "--out", str(out), *QUICK,
                       *(("--", *script_args) if script_args else ()))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    state = json.loads((out / "session.json").read_text())
    state["_dir"] = str(out)
    state["_stdout"] = done.stdout
    return state


def applied_diff(repo: Path, state: dict, knobs: Knobs) -> tuple[str, list[str]]:
    """The patch the session writes for these knobs, applied with `git apply`; the resulting diff."""
    script = Path(state["script"])
    func, step_file = step_function(record(state), script)
    written, notes = write_patch(script, func, knobs, state["user_values"], Path(state["_dir"]), root=repo,
                                 loader_site=(state.get("training_loader") or {}).get("site"), step_file=step_file)
    if written is None:
        return "", notes
    applied = subprocess.run(["git", "apply", str(written)], cwd=repo, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr + written.read_text()
    return subprocess.run(["git", "diff", "-U0"], cwd=repo, capture_output=True, text=True, check=True).stdout, notes


def changed_lines(diff: str) -> list[str]:
    """`file: -old` / `file: +new` for each changed line of a `git diff -U0`."""
    lines, current = [], None
    for line in diff.splitlines():
        if line.startswith("+++ b/"):
            current = line[6:]
        elif line[:1] in "+-" and not line.startswith(("+++", "---")):
            lines.append(f"{current}: {line[0]}{line[1:].strip()}")
    return lines


def test_gpt_trainer_in_an_imported_package(tmp_path):
    repo = repository(tmp_path)
    state = baseline(repo, "gpt/train.py", tmp_path)
    assert state["trials"][0]["status"] == "ok" and state["target"].endswith("train.py")
    # The loop is Trainer.run in minigpt/trainer.py; the batch is the config's default.
    assert state["training_loader"]["site"] == f"{repo / 'gpt' / 'minigpt' / 'trainer.py'}:30"
    assert state["user_values"]["batch_size"] == 16 and state["trials"][0]["batch_size"] == 16
    assert state["sites"]["backward"]["function"] == "Trainer.run"
    diff, notes = applied_diff(repo, state, Knobs(batch_size=32))
    assert changed_lines(diff) == ["gpt/minigpt/trainer.py: -batch_size: int = 16",
                                   "gpt/minigpt/trainer.py: +batch_size: int = 32"] and not notes


def test_per_epoch_train_function_and_an_evaluation_loader(tmp_path):
    repo = repository(tmp_path)
    state = baseline(repo, "per_epoch.py", tmp_path)
    assert state["user_values"]["batch_size"] == 32  # the training loader's, not the evaluation's 256
    assert state["sites"]["backward"]["function"] == "train"
    diff, _ = applied_diff(repo, state, Knobs(batch_size=64, num_workers=2, persistent_workers=True))
    lines = changed_lines(diff)
    assert "per_epoch.py: -BATCH_SIZE = 32" in lines and "per_epoch.py: +BATCH_SIZE = 64" in lines
    assert any("num_workers=2" in line for line in lines)
    assert not any("test_loader" in line or "256" in line for line in lines), lines  # evaluation left alone


def test_closure_loop_without_a_dataloader_is_measured_in_steps(tmp_path):
    repo = repository(tmp_path)
    state = baseline(repo, "closure.py", tmp_path)
    row = state["trials"][0]
    assert row["status"] == "ok" and state["unit"] == "steps/s" and row["samples_per_s"] > 0
    assert state["training_loader"] is None and row["batch_size"] is None
    assert any("steps/s" in note for note in state["notes"])
    assert row["loss"] is not None  # the closure returns it; the backward hands it over too
    # Labelled as measured, in the terminal and the report: steps/s, never samples/s.
    assert "steps/s" in state["_stdout"] and "samples/s" not in state["_stdout"], state["_stdout"]
    report = (Path(state["_dir"]) / "report.html").read_text()
    assert "steps/s" in report and "samples/s" not in report
    diff, _ = applied_diff(repo, state, Knobs(batch_size=64))
    assert diff == ""  # no loader: nothing to change for a batch


def test_flags_set_the_training_batch_and_only_it_changes(tmp_path):
    repo = repository(tmp_path)
    state = baseline(repo, "two_loaders.py", tmp_path)
    assert state["user_values"]["batch_size"] == 64  # --batch_size, not --eval_batch_size (100)
    diff, notes = applied_diff(repo, state, Knobs(batch_size=128))
    assert changed_lines(diff) == [
        'two_loaders.py: -parser.add_argument("--batch_size", type=int, default=64)',
        'two_loaders.py: +parser.add_argument("--batch_size", type=int, default=128)'] and not notes
    # The batch given on the command line: the flag's default is not what ran, so no literal is written
    # over the flag; the note says which flag to pass.
    subprocess.run(["git", "checkout", "-q", "."], cwd=repo, check=True)
    shutil.rmtree(tmp_path / "session")
    state = baseline(repo, "two_loaders.py", tmp_path, "--batch_size", "48")
    assert state["user_values"]["batch_size"] == 48
    diff, notes = applied_diff(repo, state, Knobs(batch_size=96))
    assert diff == "" and notes == ["batch_size comes from the command line (--batch_size 48 overrode its default): "
                                    "run with --batch_size 96"]


def test_knobs_reach_only_the_training_loader_and_threads_apply(tmp_path):
    target = str(SCRIPTS / "two_loaders.py")
    first = run_trial(TrialSpec(target, Knobs(), tmp_path / "base", steps=1, wait=1, warmup=0, device="cpu"))
    site = trial_record(first.path)["training_loader"]
    trial = run_trial(TrialSpec(target, Knobs(batch_size=32, threads=1), tmp_path / "t", steps=1, wait=1, warmup=0,
                                device="cpu", loader={"site": site["site"], "ordinal": site["ordinal"]}))
    assert trial.ok, trial.message
    record = trial_record(trial.path)
    train, evaluate = record["dataloaders"]
    assert train["training"] and train["effective"]["batch_size"] == 32 and train["outcomes"]["batch_size"] == APPLIED
    assert evaluate["effective"]["batch_size"] == 100 and evaluate["outcomes"]["batch_size"].startswith("not applicable")
    assert record["knob_outcomes"]["batch_size"] == APPLIED and record["knob_outcomes"]["threads"] == APPLIED
    assert trial.batch_size == 32 and record["user_values"]["batch_size"] == 64


def test_a_step_in_an_imported_module(tmp_path):
    package = tmp_path / "lib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write_script(package, """
        import torch

        def train_step(model, optimizer, x):
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss
    """, name="steps.py")
    script = write_script(tmp_path, """
        import torch
        from lib.steps import train_step

        model = torch.nn.Linear(8, 8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(1000):
            train_step(model, optimizer, torch.randn(4, 8))
    """, name="main.py")
    for step in ("lib.steps:train_step", "lib/steps.py:train_step"):
        trial = run_trial(TrialSpec(str(script), Knobs(), tmp_path / step.replace("/", "_"), steps=2, device="cpu",
                                    step=step))
        assert trial.ok, trial.message
        record = trial_record(trial.path)
        assert record["target"] == "train_step" and record["step"] == step
        assert trial.batch_size == 4 and trial.loss is not None
    missing = run_trial(TrialSpec(str(script), Knobs(), tmp_path / "missing", steps=2, device="cpu",
                                  step="lib.steps:nope"))
    assert missing.status == "target-not-found" and "steps.py" in missing.message


@pytest.mark.parametrize("workers", [0, 2])
def test_a_target_that_runs_inside_the_dataloader_says_so(tmp_path, workers):
    script = write_script(tmp_path, f"""
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Squares(Dataset):
            def __len__(self):
                return 64

            def __getitem__(self, index):
                return torch.tensor([float(index)]) ** 2

        if __name__ == "__main__":
            for epoch in range(10):
                for batch in DataLoader(Squares(), batch_size=4, num_workers={workers}):
                    batch.sum()
    """)
    trial = run_trial(TrialSpec(f"{script}:Squares.__getitem__", Knobs(), tmp_path / "t", steps=2, device="cpu"))
    assert trial.status == "error", trial.message
    assert "runs while the DataLoader makes a batch" in trial.message and "\n" not in trial.message


def test_no_amp_advice_for_a_float64_model(tmp_path):
    script = write_script(tmp_path, """
        import torch

        # Matmuls large enough to dominate the step even on a busy machine (64 x 256 ones left it to Python).
        model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]).double()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        for i in range(1000):
            loss = model(torch.randn(128, 512, dtype=torch.float64)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """)
    trial = run_trial(TrialSpec(str(script), Knobs(), tmp_path / "t", steps=2, device="cpu"))
    assert trial.ok, trial.message
    record = trial_record(trial.path)
    assert max(record["model_dtypes"], key=record["model_dtypes"].get) == "float64"
    diagnosis = analyze_file(sorted(trial.path.glob("*.pt.trace.json*"))[0])
    assert diagnosis.extra.get("cpu_eligible_share", 0) > 0.2  # matmul-bound: AMP would otherwise be advised
    assert "amp" not in [r.id for r in diagnosis.recommendations]


def test_a_session_that_fails_ends_with_its_record_and_a_report(tmp_path):
    script = write_script(tmp_path, """
        import torch

        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        raise RuntimeError("the data set is missing")
    """)
    out = tmp_path / "session"
    done = advisor_main("profile", str(script), "--out", str(out), "--device", "cpu")
    assert done.returncode == 1 and "the data set is missing" in done.stderr
    state = json.loads((out / "session.json").read_text())
    assert state["status"] == "failed" and any("the data set is missing" in n for n in state["notes"])
    assert (out / "report.html").is_file() and "the data set is missing" in (out / "report.html").read_text()
    assert not (out / PATCH_NAME).exists()
