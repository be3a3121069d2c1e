"""The `checkpointing` knob on examples/gpt.py: the same numbers with and without it, the memory it frees in real
CPU trials, and a `--memory-limit` session in which the larger batch fits only with it (picked from the
trials' measured peaks), its decision, its record and its patch applied and run."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from advisor.search.state import capped_peak
from advisor.search.strategy import recovery_plan
from advisor.trials.interposition.checkpointing import repeated_blocks
from advisor.trials.interposition.model import ModelInterposition
from advisor.trials.knobs import APPLIED, Knobs
from advisor.trials.process.runner import run_trial
from conftest import advisor_main
from trial_helpers import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
from gpt import GPT  # noqa: E402  (the example's model, imported as a user's module)

TWO_THREADS = {"OMP_NUM_THREADS": "2"}


def loss_and_gradients(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward and backward from a fixed RNG state (dropout draws the same masks)."""
    torch.manual_seed(1)
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("training", [True, False])
def test_checkpointed_blocks_give_the_same_loss_and_gradients_and_undo_gives_the_forward_back(training):
    torch.manual_seed(0)
    model = GPT(vocab=64, context=16, width=32, layers=3, heads=2).train(training)
    twin = copy.deepcopy(model)
    tokens = torch.randint(0, 64, (4, 16))
    assert [name for name, _ in repeated_blocks(model)] == ["blocks.0", "blocks.1", "blocks.2"]
    expected = loss_and_gradients(model, tokens)
    interposition = ModelInterposition(Knobs(checkpointing=True), "cpu")
    interposition.install()
    try:
        got = loss_and_gradients(twin, tokens)
        assert interposition.outcomes_after_steps() == {"checkpointing": APPLIED}
        plan = interposition.checkpoints.plan
        assert (plan["holder"], plan["attribute"], plan["how"], plan["block"], plan["count"]) == \
            ("GPT", "blocks", "loop", "Block", 3)
        assert Path(plan["file"]).name == "gpt.py"
        assert all("forward" in block.__dict__ for block in twin.blocks)
    finally:
        interposition.undo()
    assert all("forward" not in block.__dict__ for block in twin.blocks)
    torch.testing.assert_close(got[0], expected[0])
    for a, b in zip(got[1], expected[1]):
        torch.testing.assert_close(a, b)


def test_a_model_without_repeated_blocks_is_not_applicable_and_says_why():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    interposition = ModelInterposition(Knobs(checkpointing=True), "cpu")
    interposition.install()
    try:
        model(torch.randn(2, 8)).sum().backward()
    finally:
        interposition.undo()
    outcome = interposition.outcomes_after_steps()["checkpointing"]
    assert outcome.startswith("not applicable") and "no repeated blocks" in outcome


# --------------------------------------------------------------------------------------------------
# The memory-limited session: batch 16 → 32 fits only with checkpointing

GPT_ARGS = ("--context", "128", "--vocab", "256")


SCHEDULE = {"steps": 2, "wait": 2, "warmup": 1, "windows": 2, "window_s": 0.3}  # as the session's trials run


def capped_trial(root: Path, name: str, knobs: Knobs, limit: int) -> tuple[Any, int | None]:
    """A trial of the example at batch 32 under a CPU memory cap: the result and its capped peak."""
    result = run_trial(str(root / "gpt.py"), knobs, root / "probe" / name, device="cpu", memory_limit=limit,
                       script_args=["--batch-size", "32", *GPT_ARGS], env=TWO_THREADS, **SCHEDULE)
    return result, capped_peak(json.loads((result.path / "trial.json").read_text()))


@pytest.fixture(scope="module")
def limit_session(tmp_path_factory):
    """Batch 32 with checkpointing measured without a cap; the limit 30% above its peak (the allocator's heap
    grows and fragments from run to run); a session from batch 16 under it, on a copy of the example (its
    patch is applied to the copy); then batch 32 without checkpointing under the same limit."""
    root = tmp_path_factory.mktemp("gpt")
    shutil.copyfile(EXAMPLES / "gpt.py", root / "gpt.py")
    checkpointed, peak = capped_trial(root, "checkpointed", Knobs(checkpointing=True), 8 * 2**30)
    assert checkpointed.ok and checkpointed.knob_outcomes == {"checkpointing": APPLIED}, checkpointed.message
    limit = int(1.3 * peak)
    out = root / "run"
    done = advisor_main("profile", str(root / "gpt.py"), "--device", "cpu", "--out", str(out), "--max-trials", "2",
                        "--steps", "2", "--windows", "2", "--window", "0.3", "--memory-limit", str(limit),
                        "--only", "checkpointing,batch_size", "--", "--batch-size", "16", *GPT_ARGS,
                        cwd=root, env=TWO_THREADS)
    assert done.returncode == 0, done.stdout + done.stderr
    plain, _ = capped_trial(root, "plain", Knobs(), limit)
    return root, out, limit, plain


def test_without_checkpointing_batch_32_runs_out_of_memory_under_the_limit(limit_session):
    _, _, _, plain = limit_session
    assert plain.status == "oom", plain.message  # what the blocks saved for backward no longer fits


def test_the_limited_session_pairs_checkpointing_with_the_batch_that_does_not_fit_without_it(limit_session):
    root, out, limit, _ = limit_session
    state = json.loads((out / "session.json").read_text())
    baseline, pair = state["trials"][:2]
    assert baseline["batch_size"] == 16 and baseline["checkpoint_blocks"]["block"] == "Block"
    assert baseline["peak_capped_bytes"] < limit
    assert pair["recommendation"] == "checkpointing+larger-batch", pair
    assert pair["moves"] == {"batch_size": 32, "checkpointing": True}
    assert pair["outcomes"]["checkpointing"] == APPLIED and pair["status"] == "ok", pair
    # Kept only where the pair is faster than the best without it, beyond the noise (decide's rule).
    kept = pair["decision"] == "kept"
    assert kept == (state["final_knobs"]["checkpointing"] is True)
    if not kept:
        assert pair["decision"] == "reverted" and state["patch"] is None
        return
    assert pair["gain"] > 0 and state["final_knobs"]["batch_size"] == 32
    diff = (out / "suggested.patch").read_text()
    assert "+from torch.utils.checkpoint import checkpoint\n" in diff
    assert "+            x = checkpoint(block, x, use_reentrant=False)\n" in diff


def first_losses(script: Path, prints: int = 3) -> list[float]:
    """The first losses the script prints (steps 0, 20, 40, ...) on a small configuration; the run is stopped
    there (an epoch is 4096 windows)."""
    command = [sys.executable, "-u", str(script), "--batch-size", "8", "--context", "32", "--vocab", "128"]
    losses: list[float] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=dict(os.environ, **TWO_THREADS)) as run:
        for line in run.stdout:
            losses += [float(x) for x in re.findall(r"loss ([0-9.]+)", line)]
            if len(losses) == prints:
                run.kill()
                break
    return losses


def test_the_patch_applies_and_the_patched_script_trains_as_before(limit_session):
    root, out, _, _ = limit_session
    state = json.loads((out / "session.json").read_text())
    if state["patch"] is None:
        pytest.skip("the pair was not kept on this machine: no patch to apply")
    before = first_losses(root / "gpt.py")
    done = subprocess.run(["patch", "-p1", "-i", str(out / "suggested.patch")], cwd=state["patch_root"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    after = first_losses(root / "gpt.py")
    assert len(after) == len(before) == 3
    assert after == pytest.approx(before, abs=2e-3)  # 40 steps apart by float rounding only: dropout drew alike


def test_an_out_of_memory_baseline_tries_checkpointing_after_amp_and_before_micro_batches():
    figures = {"block": "Block", "count": 4, "saved_bytes": 100, "block_bytes": 90, "block_output_bytes": 4}
    state = {"device": {"type": "cpu", "cpu": {"bf16_instructions": False}}, "user_values": {"batch_size": 32},
             "trials": [{"status": "oom", "checkpoint_blocks": figures}]}
    plan = [p.recommendation for p in recovery_plan(state)]
    assert plan[:2] == ["oom-checkpointing", "oom-accumulation"]
    state["trials"][0]["checkpoint_blocks"] = None  # a model that repeats no blocks: nothing to checkpoint
    assert "oom-checkpointing" not in [p.recommendation for p in recovery_plan(state)]
