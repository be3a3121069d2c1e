"""The `checkpointing` knob on examples/gpt.py: the same loss and gradients with and without it, the blocks found
where a model stacks them, not applicable where a model repeats no block, a `--memory-limit` session whose batch
fits only with checkpointing and ends with both, the proposal that pairs it with the batch the memory model puts
over the limit, a trial's recorded plan written into the script and the patched script's loss curve, and its
place in the out-of-memory recovery plan."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from types import SimpleNamespace

from advisor.search.state import SessionOptions, capped_peak
from advisor.knobs import BY_NAME
from advisor.knobs.offer import Best, Learned
from advisor.search.strategy import SearchSpace, offered
from advisor.search.strategy import recovery_plan
from advisor.trials.interposition.checkpointed_blocks import repeated_blocks
from advisor.trials.interposition.model import ModelInterposition, records_of
from advisor.trials.knobs import APPLIED, Knobs
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from advisor.code.patch.plan import plan_patch
from records import record, row
from conftest import advisor_main, run_script, require
from trial_helpers import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
from gpt import GPT  # noqa: E402  (the example's model, imported as a user's module)

# The memory of thread stacks and arenas alike everywhere; set only where torch does not run two threads already
# (a variable set here gives the trials a zygote of their own).
TWO_THREADS = None if torch.get_num_threads() == 2 else {"OMP_NUM_THREADS": "2"}


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
        plan = records_of(interposition)["checkpoint_plan"]  # as trial.json records it
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


def test_blocks_stacked_in_a_sequential_are_the_blocks_not_the_sequential():
    sys.path.insert(0, str(EXAMPLES))
    from memory_hungry import LongContextModel  # blocks in an nn.Sequential, each with an nn.Sequential inside

    model = LongContextModel(vocab=16, context=8, width=8, layers=3, heads=2)
    blocks = repeated_blocks(model)
    assert [name for name, _ in blocks] == ["blocks.0", "blocks.1", "blocks.2"]
    interposition = ModelInterposition(Knobs(checkpointing=True), "cpu")
    interposition.install()
    try:
        model(torch.randint(0, 16, (2, 8))).sum().backward()
    finally:
        interposition.undo()
    plan = records_of(interposition)["checkpoint_plan"]  # as trial.json records it
    assert (plan["holder"], plan["attribute"], plan["how"], plan["block"], plan["count"]) == \
        ("LongContextModel", "blocks", "sequential", "Block", 3)
    patch = plan_patch(EXAMPLES / "memory_hungry.py", "train_step", Knobs(checkpointing=True), {}, checkpoint_plan=plan)
    assert patch.notes == [] and "checkpoint_sequential(self.blocks, len(self.blocks), " in patch.diff


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
# Under a CPU --memory-limit: batch 32 fits only with checkpointing

GPT_ARGS = ("--context", "128", "--vocab", "256")


@pytest.fixture(scope="module")
def limit(tmp_path_factory):
    """A limit 1.3 times the capped peak of a profiled step at batch 16: the cap counts what the step holds
    (the allocator gives freed blocks back), so batch 16 fits and batch 32 without checkpointing does not
    (its activations twice batch 16's), while batch 32 with it does (one block's activations at a time)."""
    root = tmp_path_factory.mktemp("probe")
    shutil.copyfile(EXAMPLES / "gpt.py", root / "gpt.py")
    probe = run_trial(TrialSpec(str(root / "gpt.py"), Knobs(), root / "probe", steps=1, wait=1, warmup=1, device="cpu",
                                memory_limit=8 * 2**30, script_args=["--batch-size", "16", *GPT_ARGS], profile=True,
                                env=TWO_THREADS))
    assert probe.ok, probe.message
    record = json.loads((probe.path / "trial.json").read_text())
    assert record["memory_cap"]["freed_blocks_returned"] is (sys.platform == "linux")
    return int(1.3 * capped_peak(record))


def limited_session(root: Path, limit: int, batch: int) -> Path:
    """A session on examples/gpt.py from `batch` under `limit`, turning only checkpointing and the batch."""
    shutil.copyfile(EXAMPLES / "gpt.py", root / "gpt.py")
    out = root / "run"
    done = advisor_main("profile", str(root / "gpt.py"), "--device", "cpu", "--out", str(out), "--max-trials", "2",
                        "--steps", "2", "--windows", "0", "--memory-limit", str(limit),
                        "--only", "checkpointing,batch_size", "--", "--batch-size", str(batch), *GPT_ARGS,
                        cwd=root, env=TWO_THREADS)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_a_batch_that_fits_only_with_checkpointing_ends_the_session_with_both(limit, tmp_path):
    out = limited_session(tmp_path, limit, 32)
    state = json.loads((out / "session.json").read_text())
    baseline, recovery = state["trials"][:2]
    assert baseline["status"] == "oom" and baseline["checkpoint_blocks"]["block"] == "Block", baseline
    assert recovery["recommendation"] == "oom-checkpointing" and recovery["moves"] == {"checkpointing": True}
    assert recovery["status"] == "ok" and recovery["decision"] == "kept", recovery
    assert recovery["outcomes"]["checkpointing"] == APPLIED and recovery["peak_capped_bytes"] < limit
    assert state["final_knobs"]["checkpointing"] is True and recovery["batch_size"] == 32
    diff = (out / "suggested.patch").read_text()
    assert "+            x = checkpoint(block, x, use_reentrant=False)\n" in diff
    assert "batch" not in "".join(line for line in diff.splitlines() if line.startswith("+"))  # 32 as written


def test_a_larger_batch_the_memory_model_puts_over_the_limit_comes_with_checkpointing():
    # A best at batch 16 whose profiled steps held 180 MiB under a 230 MiB cap (as a limited session's baseline
    # row records it): batch 32 does not fit without checkpointing, so the step to 32 comes with it; under a
    # cap it fits, the plain step. Once the pair was measured, or where checkpointing is --skip'ped, no larger
    # batch fits: nothing.
    mib = 2**20
    figures = {"block": "Block", "count": 4, "saved_bytes": 90 * mib, "block_bytes": 22 * mib,
               "block_output_bytes": mib}
    baseline = {"name": "00-baseline", "status": "ok", "batch_size": 16, "peak_memory_bytes": 900 * mib,
                "peak_capped_bytes": 180 * mib, "capacity_bytes": 230 * mib, "checkpoint_blocks": figures,
                "knobs": Knobs().to_dict()}
    options = SessionOptions(device="cpu")

    def proposal(capacity: int, trials: tuple[dict, ...] = (), space: SearchSpace = SearchSpace()) -> object:
        """The batch's move from that best (its module's offer, as the search proposes it)."""
        learned = Learned(tuple(row(**t) for t in (dict(baseline, capacity_bytes=capacity), *trials)))
        made = offered(BY_NAME["batch_size"], Best.of(Knobs(), {}, "host", {}, 1, space, 1, learned,
                                                      SimpleNamespace(name="00-baseline", batch_size=16), options))
        return made[0] if made else None

    pair = proposal(230 * mib)
    assert pair.recommendation == "checkpointing+larger-batch" and pair.move_dict == {"checkpointing": True,
                                                                                    "batch_size": 32}
    assert pair.knobs == Knobs(checkpointing=True, batch_size=32)
    assert proposal(2**34).move_dict == {"batch_size": 32}  # it fits: the batch step alone is the change
    measured = {"name": "01-checkpointing-batch-32", "status": "ok", "knobs": pair.knobs.to_dict()}
    assert proposal(230 * mib, (measured,)) is None
    assert proposal(230 * mib, space=SearchSpace(skip=frozenset({"checkpointing"}))) is None


def first_losses(script: Path, prints: int = 3) -> list[float]:
    """The first losses the script prints (steps 0, 20, 40) on a small configuration, run as `python SCRIPT` runs
    it (forked from this worker's zygote: torch is imported there already)."""
    done = run_script(script, "--batch-size", "8", "--context", "32", "--vocab", "128",
                      "--max-steps", str(20 * (prints - 1) + 1), cwd=script.parent)
    assert done.returncode == 0, done.stdout[-2000:]
    return [float(x) for x in re.findall(r"loss ([0-9.]+)", done.stdout)][:prints]


def test_the_patch_from_a_trials_plan_applies_and_the_script_trains_as_before(tmp_path):
    require("patch")
    script = tmp_path / "gpt.py"
    shutil.copyfile(EXAMPLES / "gpt.py", script)
    # The plan as the trial records it: the blocks found in the running model, the file its class came from.
    trial = run_trial(TrialSpec(str(script), Knobs(checkpointing=True), tmp_path / "trial", steps=1, wait=0, warmup=0,
                                device="cpu", script_args=["--batch-size", "4", "--context", "16"], profile=False,
                                env=TWO_THREADS))
    assert trial.ok, trial.message
    plan = json.loads((trial.path / "trial.json").read_text())["checkpoint_plan"]
    assert Path(plan["file"]) == script
    assert (plan["holder"], plan["attribute"], plan["how"]) == ("GPT", "blocks", "loop")
    patch = plan_patch(script, None, Knobs(checkpointing=True), {}, checkpoint_plan=plan)
    assert patch.notes == []
    before = first_losses(script)
    (tmp_path / "suggested.patch").write_text(patch.diff)
    done = subprocess.run(["patch", "-p1", "-i", "suggested.patch"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    patched = script.read_text()
    assert "from torch.utils.checkpoint import checkpoint\n" in patched
    assert "            x = checkpoint(block, x, use_reentrant=False)\n" in patched
    after = first_losses(script)
    assert len(after) == len(before) == 3
    assert after == pytest.approx(before, abs=2e-3)  # 40 steps on: float rounding only (dropout drew alike)


def test_an_out_of_memory_baseline_tries_checkpointing_after_amp_and_before_micro_batches():
    figures = {"block": "Block", "count": 4, "saved_bytes": 100, "block_bytes": 90, "block_output_bytes": 4}
    state = {"device": {"type": "cpu", "cpu": {"bf16_instructions": False}}, "user_values": {"batch_size": 32},
             "trials": [{"status": "oom", "checkpoint_blocks": figures}]}
    plan = [p.recommendation for p in recovery_plan(record(state))]
    assert plan[:2] == ["oom-checkpointing", "oom-accumulation"]
    state["trials"][0]["checkpoint_blocks"] = None  # a model that repeats no blocks: nothing to checkpoint
    assert "oom-checkpointing" not in [p.recommendation for p in recovery_plan(record(state))]
