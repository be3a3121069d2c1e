"""Training through frameworks (tests/scripts/frameworks/): a tiny GPT-2 built from a config and trained with
transformers' Trainer on random tokens, and a small LightningModule CNN trained with Lightning's Trainer.
One real trial per framework (CPU, a few steps, the knobs applied; module-scoped), run from a folder other
than the script's: the steps and the training loader are found, the knobs applied in the framework's own
terms, the script's own values recorded, the patch written in the framework's vocabulary, applied with
`git apply` to a copy, and the patched script run. The patch rules for what the trials do not turn
(compile, TF32, Accelerator, a framework the patch does not know) are checked on the same scripts without
a run. Nothing downloads from a hub (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
from conftest import run_script
from records import session
from test_scripts import changed_lines, repository
from trial_helpers import write_script

from advisor.analysis.analyze import analyze_path
from advisor.code.patch import plan_patch, write_patch
from advisor.search.outputs import step_function
from advisor.trials.knobs import APPLIED, Knobs
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (importlib.util.find_spec("transformers") and importlib.util.find_spec("lightning")),
    reason="the frameworks are test extras: make install")]
# Nothing downloads from a hub: tests/conftest.py sets HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE for the whole
# suite, so these trials run in the environment the others run in (and are forked from the same zygote).
TRIAL = {"device": "cpu", "steps": 2, "wait": 1, "warmup": 0, "timeout_s": 900}


def framework_trial(tmp_path_factory, script: str, knobs: Knobs) -> dict:
    """One trial of a copy of `frameworks/<script>` (in a git repository) with `knobs`, run from another
    folder (`work`) as `advisor profile repo/frameworks/<script>` would be there."""
    base = tmp_path_factory.mktemp(script.removesuffix(".py"))
    repo = repository(base)
    work = base / "work"
    work.mkdir()
    with contextlib.chdir(work):
        trial = run_trial(TrialSpec(str(repo / "frameworks" / script), knobs, base / "trial", **TRIAL))
    record = json.loads((trial.path / "trial.json").read_text())
    assert trial.ok, record["message"] + (record.get("traceback") or "")
    return {"repo": repo, "work": work, "trial": trial, "record": record, "knobs": knobs,
            "script": repo / "frameworks" / script}


def patch_lines(run: dict) -> tuple[list[str], list[str]]:
    """The session's patch for the trial's knobs (as `finish_outputs` writes it), applied with `git apply`."""
    record, script = run["record"], run["script"]
    func, step_file = step_function(session(target=str(script), sites=record["sites"]), script)
    assert func is None  # the framework calls backward: no function of the script runs the step
    written, notes = write_patch(script, func, run["knobs"], record["user_values"], run["trial"].path,
                                 root=run["repo"], loader_site=(record["training_loader"] or {}).get("site"),
                                 step_file=step_file)
    assert written is not None, notes
    applied = subprocess.run(["git", "apply", str(written)], cwd=run["repo"], capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr + written.read_text()
    diff = subprocess.run(["git", "diff", "-U0"], cwd=run["repo"], capture_output=True, text=True, check=True)
    return changed_lines(diff.stdout), notes


def run_patched(run: dict, *args: str) -> None:
    """The patched script runs to its end (a few steps), from the work folder."""
    done = run_script(run["script"], *args, cwd=run["work"])
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> dict:
    # A batch of 16 as two micro-batches of 8: the effective batch doubles, the loader's batch stays.
    return framework_trial(tmp_path_factory, "hf_trainer.py",
                           Knobs(amp="bf16", batch_size=16, accumulation_steps=2, fused_optimizer=True))


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory) -> dict:
    return framework_trial(tmp_path_factory, "lightning_cnn.py",
                           Knobs(amp="bf16", batch_size=32, channels_last=True, fused_optimizer=True))


def test_the_trainer_takes_the_batch_through_training_arguments(hf):
    record = hf["record"]
    assert record["knob_outcomes"] == {"amp": APPLIED, "batch_size": APPLIED, "accumulation_steps": APPLIED,
                                       "fused_optimizer": APPLIED}
    # accelerate rebuilds the Trainer's loader with a batch_sampler; the batch came through TrainingArguments:
    # per_device_train_batch_size 8, gradient_accumulation_steps 2, so each optimizer step took 16 samples.
    # (Its loader fetches one batch ahead: the first step, never measured, counts one more.)
    assert {s["batch_size"] for s in record["steps"] if s["phase"] != "wait"} == {16}
    assert record["summary"]["batch_size"] == 16
    assert record["user_values"]["batch_size"] == 8  # the script's per_device_train_batch_size, not the sampler's 1
    assert record["framework"]["framework"] == "transformers"
    # Sites are the script's lines, not the installed packages' that built the loaders or called backward.
    script = str(hf["script"])
    assert record["framework"]["site"].startswith(script + ":")
    assert record["training_loader"]["site"].startswith(script + ":")
    assert record["sites"]["backward"]["file"] == script
    # The trial ran where the command was run: the Trainer's output_dir="hf_out" is there, not by the script.
    assert (hf["work"] / "hf_out").is_dir() and not (hf["script"].parent / "hf_out").exists()


def test_the_trainer_patch_is_in_training_arguments_and_runs(hf):
    lines, notes = patch_lines(hf)
    assert sorted(lines) == sorted([  # the per-device batch stays 8 (the --batch-size default), two of them a step
        "frameworks/hf_trainer.py: +gradient_accumulation_steps=2,",
        'frameworks/hf_trainer.py: -optim="adamw_torch",',
        'frameworks/hf_trainer.py: +optim="adamw_torch_fused",',
        "frameworks/hf_trainer.py: +bf16=True,",
        # The Trainer refuses bf16 without a GPU unless told so; where there is one, this is False.
        "frameworks/hf_trainer.py: +use_cpu=not torch.cuda.is_available(),",
    ]), lines
    assert not [n for n in notes if "not written" in n], notes
    run_patched(hf, "--steps", "2")


def test_lightning_steps_loader_and_knobs(lightning_run):
    record = lightning_run["record"]
    assert record["knob_outcomes"] == {"amp": APPLIED, "batch_size": APPLIED, "channels_last": APPLIED,
                                       "fused_optimizer": APPLIED}
    assert {s["batch_size"] for s in record["steps"] if s["phase"] != "wait"} == {32}
    assert record["user_values"]["batch_size"] == 16
    assert record["training_loader"]["site"].startswith(str(lightning_run["script"]) + ":")


def test_lightning_closure_is_not_charged_to_the_optimizer(lightning_run):
    """Lightning calls optimizer.step(closure): the closure's forward and backward are its own figure, and
    the optimizer's own update is what is left of the step's span (fused: its ops, not the closure's)."""
    (diagnosis,) = analyze_path(lightning_run["trial"].path)
    optimizer = diagnosis.extra["optimizer"]
    assert optimizer["name"] == "Adam" and optimizer["implementation"] == "fused"
    assert optimizer["closure_us_per_step"] > 0 and optimizer["us_per_step"] >= 0


def test_lightning_patch_is_in_the_trainer_and_the_module_and_runs(lightning_run):
    lines, notes = patch_lines(lightning_run)
    file = "frameworks/lightning_cnn.py"
    assert f"{file}: -BATCH_SIZE = 16" in lines and f"{file}: +BATCH_SIZE = 32" in lines
    assert f"{file}: +return torch.optim.Adam(self.parameters(), lr=1e-3, fused=True)" in lines
    assert f"{file}: +model = model.to(memory_format=torch.channels_last)  # NHWC: faster convolutions" in lines
    assert any(line.startswith(f"{file}: +") and 'precision="bf16-mixed"' in line for line in lines), lines
    assert len(lines) == 8, lines  # 3 changed lines (-/+), one added line each for the model and precision
    assert not [n for n in notes if "not written" in n], notes
    run_patched(lightning_run, "--max-steps", "2")


SCRIPTS = Path(__file__).resolve().parent / "scripts" / "frameworks"


def test_compile_tf32_and_workers_in_framework_terms():
    """What the trials above do not turn (a compile takes minutes on this CPU), written in each framework's terms."""
    hf = plan_patch(SCRIPTS / "hf_trainer.py", None, Knobs(compile=True, tf32=True, num_workers=2),
                    {"num_workers": 0}).diff
    assert "+    torch_compile=True," in hf and "+    tf32=True," in hf
    assert "-    dataloader_num_workers=0," in hf and "+    dataloader_num_workers=2," in hf
    light = plan_patch(SCRIPTS / "lightning_cnn.py", None, Knobs(compile=True, tf32=True, amp="fp16"), {}).diff
    assert "+    model = torch.compile(model)" in light and 'precision="16-mixed"' in light
    assert '+torch.set_float32_matmul_precision("high")' in light


def test_accumulation_keeps_the_effective_batch_in_training_arguments():
    diff = plan_patch(SCRIPTS / "hf_trainer.py", None, Knobs(accumulation_steps=2), {"batch_size": 8}).diff
    assert "default=4)" in diff and "+    gradient_accumulation_steps=2," in diff


def test_accelerator_mixed_precision(tmp_path):
    script = write_script(tmp_path, """
        from accelerate import Accelerator
        accelerator = Accelerator()
    """)
    diff = plan_patch(script, None, Knobs(amp="bf16"), {}).diff
    assert '+accelerator = Accelerator(mixed_precision="bf16")' in diff


def test_a_setting_owned_by_an_unknown_framework_is_named_with_its_value(tmp_path):
    """The loader is built inside a library the patch does not know: the note names the setting, its value
    and where (no silent 'no suggested.patch')."""
    script = write_script(tmp_path, """
        import somelib
        trainer = somelib.Trainer(batch=16)
        trainer.fit()
    """)
    patch = plan_patch(script, None, Knobs(batch_size=32, amp="bf16"), {"batch_size": 16},
                       loader_site=f"{script}:4")
    assert patch.diff == ""
    assert any("batch_size=32 (was 16) is not written" in n and f"{script}:4" in n for n in patch.notes), patch.notes
    assert any(n.startswith("amp=bf16 is not written") for n in patch.notes), patch.notes


def test_init_process_group_that_is_never_reached_runs_as_one_process(tmp_path):
    """The one-rank job is decided when init_process_group is called: a call under a flag left off runs the
    script as it is, in one process."""
    script = write_script(tmp_path, """
        import argparse
        import torch
        import torch.distributed as dist
        parser = argparse.ArgumentParser()
        parser.add_argument("--distributed", action="store_true")
        args = parser.parse_args()
        if args.distributed:
            dist.init_process_group("gloo")
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(100):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """)
    trial = run_trial(TrialSpec(str(script), Knobs(), tmp_path / "t", device="cpu", steps=2, wait=1, warmup=0))
    record = json.loads((trial.path / "trial.json").read_text())
    assert trial.ok, record["message"]
    assert record["single_rank_job"] is False


@pytest.fixture(scope="module")
def accelerate_run(tmp_path_factory) -> dict:
    return framework_trial(tmp_path_factory, "accelerate_loop.py", Knobs(amp="bf16", batch_size=32))


def test_an_accelerate_loop_takes_the_batch_where_the_script_builds_its_loader(accelerate_run):
    """accelerator.prepare rebuilds the loader with a batch_sampler: the knobs go to the loader the script
    built, which the rebuild takes its batches from; AMP is the Accelerator's mixed_precision."""
    record = accelerate_run["record"]
    assert record["knob_outcomes"] == {"amp": APPLIED, "batch_size": APPLIED}
    assert {s["batch_size"] for s in record["steps"] if s["phase"] != "wait"} == {32}
    assert record["user_values"]["batch_size"] == 16
    loader = record["dataloaders"][record["training_loader"]["index"]]
    assert loader["site"].endswith("accelerate_loop.py:21") and loader["training"]
    lines, notes = patch_lines(accelerate_run)
    file = "frameworks/accelerate_loop.py"
    assert sorted(lines) == sorted([f"{file}: -BATCH_SIZE = 16", f"{file}: +BATCH_SIZE = 32",
                                    f"{file}: -accelerator = Accelerator()",
                                    f'{file}: +accelerator = Accelerator(mixed_precision="bf16")']), (lines, notes)
    run_patched(accelerate_run, "--max-steps", "2")


def test_a_batch_sampler_of_the_script_makes_the_batch_not_applicable_with_its_own_reason(tmp_path):
    """The training loader takes its batches from the script's batch_sampler: the batch knob is not applicable
    for that reason (not "not the training loader", which an evaluation loader says), and the baseline's
    record says so, so the session proposes no batch change."""
    script = write_script(tmp_path, """
        import torch
        from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset
        data = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
        evaluation = DataLoader(data, batch_size=64)
        train = DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), batch_size=16, drop_last=True))
        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for epoch in range(100):
            for x, y in train:
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    """)
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if text.startswith("train ="))
    # As a session's later trials are told by its baseline: the loader at that line trains.
    trial = run_trial(TrialSpec(str(script), Knobs(batch_size=32), tmp_path / "t", device="cpu", steps=2, wait=1,
                                warmup=0, loader={"site": f"{script}:{line}", "ordinal": 0}))
    record = json.loads((trial.path / "trial.json").read_text())
    assert trial.ok, record["message"]
    assert record["knob_outcomes"] == {"batch_size": "not applicable: the DataLoader uses a batch_sampler"}
    assert record["training_loader"]["batch_sampler"] is True
    assert {s["batch_size"] for s in record["steps"]} == {16}
