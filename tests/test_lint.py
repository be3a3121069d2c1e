"""`advisor lint`: one script per rule that triggers it (rule id and line), one where the fix removes it,
the near misses each rule must not report, and the command line (exit codes 0/1/2, --json, one-line errors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from advisor.code import lint
from advisor.errors import AdvisorError
from advisor.code.lint import RULES, LintError, LintFinding, lint_file, lint_source

REPO = Path(__file__).resolve().parent.parent
CASES = Path(__file__).resolve().parent / "lint_cases"
MARK = "# <-"  # marks the line a finding must point at


def findings(source: str) -> list[tuple[str, int]]:
    """(rule, line) of every finding in a dedented source snippet."""
    return [(f.rule, f.line) for f in lint_source(textwrap.dedent(source), "case.py")]


def rules(source: str) -> set[str]:
    return {rule for rule, _ in findings(source)}


def marked_line(source: str) -> int:
    """1-based number of the line carrying the `# <-` marker."""
    lines = textwrap.dedent(source).splitlines()
    return next(i for i, line in enumerate(lines, start=1) if MARK in line)


def assert_finds(source: str, rule: str) -> None:
    """The rule fires on the marked line."""
    assert (rule, marked_line(source)) in findings(source), findings(source)


# ---------------------------------------------------------------------------------------------------
# Rule: loss-accumulation

LOSS_ACCUMULATION = """
import torch
import torch.nn as nn

model = nn.Linear(4, 2)
criterion = nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
total_loss = 0
for step in range(10):
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    loss = criterion(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    total_loss += loss  # <-
print(total_loss / 10)
"""


def test_loss_accumulation_found_with_fix():
    assert_finds(LOSS_ACCUMULATION, "loss-accumulation")
    (finding,) = [f for f in lint_source(textwrap.dedent(LOSS_ACCUMULATION)) if f.rule == "loss-accumulation"]
    assert finding.fix == "total_loss += loss.item()"
    assert "total_loss += loss" in finding.what


def test_a_script_is_linted_once_while_it_stays_as_it_was(tmp_path):
    """A session diagnoses every trial's trace, each naming the same script: its findings are read once, and a
    script written again (another stamp) is linted again; a caller's changes to the findings stay its own."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(LOSS_ACCUMULATION))
    first = lint.script_findings(script)
    assert [f["rule"] for f in first] == ["loss-accumulation"]
    first[0]["rule"] = "changed by the caller"
    hits = lint.run._script_findings.cache_info().hits
    assert lint.script_findings(script)[0]["rule"] == "loss-accumulation"
    assert lint.run._script_findings.cache_info().hits == hits + 1
    script.write_text(textwrap.dedent(LOSS_ACCUMULATION).replace("total_loss += loss  # <-", "total_loss += 1.0"))
    os.utime(script, ns=(1, 1))  # a stamp of its own, however coarse the file system's clock
    assert lint.script_findings(script) == []


def test_loss_accumulation_fixed():
    fixed = LOSS_ACCUMULATION.replace("total_loss += loss  # <-", "total_loss += loss.item()")
    assert "loss-accumulation" not in rules(fixed)


@pytest.mark.parametrize(
    "accumulate",
    [
        "total_loss = total_loss + loss  # <-",
        "total_loss += loss * x.size(0)  # <-",
        "total_loss += loss.mean()  # <-",
    ],
)
def test_loss_accumulation_variants(accumulate):
    assert_finds(LOSS_ACCUMULATION.replace("total_loss += loss  # <-", accumulate), "loss-accumulation")


@pytest.mark.parametrize(
    "accumulate",
    [
        "total_loss += float(loss)",
        "total_loss += loss.detach()",
        "total_loss += loss.item() * x.size(0)",
        "total_loss += loss.data",
    ],
)
def test_loss_accumulation_graph_free_values(accumulate):
    assert "loss-accumulation" not in rules(LOSS_ACCUMULATION.replace("total_loss += loss  # <-", accumulate))


def test_loss_accumulation_functional_loss_and_other_names():
    source = """
    import torch
    import torch.nn.functional as F

    def train(model, loader, opt):
        running = 0.0
        for x, y in loader:
            err = F.cross_entropy(model(x), y)
            err.backward()
            opt.step()
            running += err  # <-
        return running
    """
    assert_finds(source, "loss-accumulation")


def test_loss_accumulation_through_the_scripts_step_function():
    source = """
    def train_step(model, batch, opt):
        out = model(batch)
        loss = out.pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    def train_step_clean(model, batch, opt):
        loss = model(batch).pow(2).mean()
        loss.backward()
        return loss.item()

    def run(model, loader, opt):
        seen, clean = 0, 0
        for batch in loader:
            seen += train_step(model, batch, opt)  # <-
            clean += train_step_clean(model, batch, opt)
        return seen, clean
    """
    assert findings(source) == [("loss-accumulation", marked_line(source))]


def test_loss_accumulation_into_state_inside_a_step_function():
    source = """
    class Trainer:
        def train_step(self, x, y):
            loss = self.criterion(self.model(x), y)
            loss.backward()
            self.epoch_loss += loss  # <-
    """
    assert_finds(source, "loss-accumulation")


def test_loss_kept_in_a_list():
    source = """
    def train(model, loader, opt, criterion):
        losses, history = [], []
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            losses.append(loss)  # <-
            history += [loss, x.size(0)]
        return losses
    """
    result = [f for f in lint_source(textwrap.dedent(source)) if f.rule == "loss-accumulation"]
    assert [(f.line, f.fix) for f in result] == [
        (marked_line(source), "losses.append(loss.item())"),
        (marked_line(source) + 1, "history += [loss.item(), x.size(0)]"),
    ]


def test_losses_collected_for_one_backward_not_reported():
    source = """
    import torch

    def multi_task(model, heads, x, targets, criterion):
        losses = []
        for head, y in zip(heads, targets):
            losses.append(criterion(head(model(x)), y))
        total = torch.stack(losses).sum()
        total.backward()

    def chunked(model, chunks, criterion, y, scaler):
        loss = 0
        for chunk in chunks:
            loss += criterion(model(chunk), y)
        scaler.scale(loss / len(chunks)).backward()
    """
    assert "loss-accumulation" not in rules(source)


def test_sum_returned_as_one_steps_loss_not_reported():
    source = """
    def get_loss(outputs, criterion, y):
        loss = 0.0
        for out in outputs:
            loss += criterion(out, y)
        return loss
    """
    assert "loss-accumulation" not in rules(source)


def test_epoch_total_returned_is_still_a_leak():
    source = """
    def train_epoch(model, loader, criterion, opt):
        total = 0.0
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            opt.step()
            total += loss  # <-
        return total / len(loader)
    """
    assert_finds(source, "loss-accumulation")


def test_loss_accumulation_near_misses():
    source = """
    import torch

    def evaluate(model, loader, criterion):
        total = 0
        with torch.no_grad():
            for x, y in loader:
                total += criterion(model(x), y)        # no graph under no_grad
        return total

    def accumulate_then_backward(model, chunks, criterion, y):
        total = 0
        for chunk in chunks:
            total = total + criterion(model(chunk), y)  # summed on purpose, backward on the sum
        total.backward()

    def counts(loader):
        seen = correct = 0
        for x, y in loader:
            seen += y.size(0)                        # not a loss
            correct += (x.argmax(1) == y).sum()
        return seen, correct

    def once(model, x, y, criterion):
        loss = criterion(model(x), y)
        total = 0
        total += loss                                # not in a loop
        return total

    def detached(model, loader, criterion):
        total = 0
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            loss = loss.detach()
            total += loss
        return total
    """
    assert "loss-accumulation" not in rules(source)


def test_loss_accumulation_under_no_grad_decorated_caller():
    source = """
    import torch

    def score(model, loader, criterion):
        total = 0
        for x, y in loader:
            total += criterion(model(x), y)
        return total

    with torch.no_grad():
        score(None, [], None)
    """
    assert "loss-accumulation" not in rules(source)


# ---------------------------------------------------------------------------------------------------
# Rule: eval-without-no-grad

EVAL = """
import torch

def evaluate(model, loader):
    model.eval()
    correct = 0
    for x, y in loader:
        out = model(x)  # <-
        correct += (out.argmax(1) == y).sum().item()
    return correct
"""


def test_eval_without_no_grad_found():
    assert_finds(EVAL, "eval-without-no-grad")
    (finding,) = [f for f in lint_source(textwrap.dedent(EVAL)) if f.rule == "eval-without-no-grad"]
    assert "torch.inference_mode()" in finding.fix and "line 7" in finding.fix


@pytest.mark.parametrize(
    "fixed",
    [
        EVAL.replace("def evaluate", "@torch.no_grad()\ndef evaluate"),
        EVAL.replace("def evaluate", "@torch.inference_mode()\ndef evaluate"),
        EVAL.replace(
            "    for x, y in loader:\n        out = model(x)  # <-",
            "    with torch.no_grad():\n        for x, y in loader:\n            out = model(x)",
        ),
        EVAL.replace(
            "    for x, y in loader:\n        out = model(x)  # <-",
            "    with torch.inference_mode():\n        for x, y in loader:\n            out = model(x)",
        ),
        EVAL + "\nwith torch.no_grad():\n    evaluate(None, [])\n",
        EVAL.replace("    model.eval()\n", "    model.eval()\n    torch.set_grad_enabled(False)\n"),
    ],
)
def test_eval_without_no_grad_fixed(fixed):
    assert "eval-without-no-grad" not in rules(fixed)


def test_eval_at_module_level_and_back_to_training():
    source = """
    import torch
    from torch import nn

    model = nn.Linear(4, 2)
    loader = [(torch.randn(2, 4), torch.tensor([0, 1]))]
    for epoch in range(3):
        model.train()
        for x, y in loader:
            model(x).sum().backward()          # training: not reported
        model.eval()
        for x, y in loader:
            preds = model(x)  # <-
    """
    result = findings(source)
    assert result == [("eval-without-no-grad", marked_line(source))]
    finding = [f for f in lint_source(textwrap.dedent(source)) if f.rule == "eval-without-no-grad"][0]
    assert "line 12" in finding.fix  # the validation loop, not the epoch loop that also trains


def test_training_with_frozen_batchnorm_not_reported():
    """`.eval()` to freeze BatchNorm statistics while training: the loop needs autograd."""
    source = """
    def finetune(model, loader, opt):
        model.eval()
        for x, y in loader:
            loss = model(x).sum()
            loss.backward()
            opt.step()
    """
    assert "eval-without-no-grad" not in rules(source)


def test_eval_without_a_loop_or_other_receiver_not_reported():
    source = """
    import torch

    def predict(model, x):
        model.eval()
        return model(x)          # a single forward, not an evaluation loop

    def train(model, teacher, loader):
        teacher.eval()
        for x, y in loader:
            out = model(x)       # `model` is training; only `teacher` is in eval mode
            with torch.no_grad():
                target = teacher(x)
    """
    assert "eval-without-no-grad" not in rules(source)


# ---------------------------------------------------------------------------------------------------
# Rule: half-with-batchnorm

HALF = """
import torch
import torch.nn as nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x))

model = Net().cuda()
model.half()  # <-
for x in batches:
    model(x).sum().backward()
"""


def test_half_with_batchnorm_found():
    assert_finds(HALF, "half-with-batchnorm")
    finding = [f for f in lint_source(textwrap.dedent(HALF)) if f.rule == "half-with-batchnorm"][0]
    assert "torch.autocast" in finding.fix


@pytest.mark.parametrize(
    "conversion",
    ["model = model.to(torch.float16)  # <-", "model.to(dtype=torch.half)  # <-", "net = Net().half()  # <-"],
)
def test_half_with_batchnorm_variants(conversion):
    assert_finds(HALF.replace("model.half()  # <-", conversion), "half-with-batchnorm")


def test_half_with_torchvision_resnet():
    source = """
    import torch
    import torchvision

    model = torchvision.models.resnet50()
    model = model.cuda().half()  # <-
    loss = model(images).sum()
    loss.backward()
    """
    assert_finds(source, "half-with-batchnorm")


def test_half_for_inference_only_not_reported():
    """BatchNorm in eval mode uses its running statistics: fp16 inference is common and fine."""
    source = """
    import torch
    import torchvision

    model = torchvision.models.resnet50().eval().cuda().half()
    with torch.inference_mode():
        for images in batches:
            print(model(images.cuda().half()).argmax(1))
    """
    assert findings(source) == []


@pytest.mark.parametrize(
    "fixed",
    [
        # the fix: fp32 weights, autocast for the forward pass
        HALF.replace(
            "model.half()  # <-",
            "x = torch.randn(2, 3, 8, 8).cuda()\nwith torch.autocast('cuda', dtype=torch.float16):\n    out = model(x)",
        ),
        # no BatchNorm in the model
        HALF.replace("nn.BatchNorm2d(8)", "nn.ReLU()"),
        # BatchNorm put back to fp32 after .half()
        HALF
        + "for m in model.modules():\n    if isinstance(m, nn.BatchNorm2d):\n        m.float()\n",
        # the input is converted, not the model
        HALF.replace("model.half()  # <-", "x = torch.randn(2, 3, 8, 8).cuda().half()"),
    ],
)
def test_half_with_batchnorm_absent(fixed):
    assert "half-with-batchnorm" not in rules(fixed)


# ---------------------------------------------------------------------------------------------------
# Rule: data-parallel


@pytest.mark.parametrize(
    "source",
    [
        "import torch.nn as nn\nmodel = nn.Linear(2, 2)\nmodel = nn.DataParallel(model)  # <-\n",
        "import torch\nmodel = torch.nn.DataParallel(torch.nn.Linear(2, 2))  # <-\n",
        "from torch.nn import DataParallel\nmodel = DataParallel(net)  # <-\n",
    ],
)
def test_data_parallel_found(source):
    assert_finds(source, "data-parallel")
    finding = [f for f in lint_source(source) if f.rule == "data-parallel"][0]
    assert "DistributedDataParallel" in finding.fix and "torchrun" in finding.fix


def test_data_parallel_absent_with_ddp():
    source = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(2, 2).to(0), device_ids=[0])
    """
    assert "data-parallel" not in rules(source)


# ---------------------------------------------------------------------------------------------------
# Rules: dataloader-num-workers, dataloader-pin-memory, non-blocking-copy

LOADER = """
import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 2).to(device)
ds = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
loader = DataLoader(ds, batch_size=8, shuffle=True)  # <-
for x, y in loader:
    x, y = x.to(device), y.to(device)
    model(x).sum().backward()
"""


def test_dataloader_num_workers_found_with_fix():
    assert_finds(LOADER, "dataloader-num-workers")
    finding = [f for f in lint_source(textwrap.dedent(LOADER)) if f.rule == "dataloader-num-workers"][0]
    assert finding.fix == "DataLoader(ds, batch_size=8, shuffle=True, num_workers=4, persistent_workers=True)"


def test_dataloader_num_workers_zero_found():
    assert_finds(LOADER.replace("shuffle=True)", "shuffle=True, num_workers=0)"), "dataloader-num-workers")


@pytest.mark.parametrize(
    "args",
    ["shuffle=True, num_workers=4)", "shuffle=True, num_workers=args.workers)", "**loader_kwargs)"],
)
def test_dataloader_num_workers_absent(args):
    assert "dataloader-num-workers" not in rules(LOADER.replace("shuffle=True)", args))


CLI_WORKERS = """
import argparse
from torch.utils.data import DataLoader

parser = argparse.ArgumentParser()
parser.add_argument("--num-workers", type=int, default=0)
parser.add_argument("--pin-memory", action="store_true")
args = parser.parse_args()
loader = DataLoader(ds, batch_size=8, num_workers=args.num_workers, pin_memory=args.pin_memory)  # <-
for x, y in loader:
    x = x.cuda(non_blocking=True)
"""


def test_dataloader_options_from_the_command_line_use_their_defaults():
    result = lint_source(textwrap.dedent(CLI_WORKERS))
    assert {(f.rule, f.line) for f in result} == {
        ("dataloader-num-workers", marked_line(CLI_WORKERS)),
        ("dataloader-pin-memory", marked_line(CLI_WORKERS)),
    }
    workers = [f for f in result if f.rule == "dataloader-num-workers"][0]
    assert workers.fix.startswith("parser.add_argument('--num-workers', type=int, default=4)")
    assert "default is 0" in workers.what


def test_dataloader_options_from_the_command_line_with_good_defaults():
    source = CLI_WORKERS.replace("default=0", "default=8").replace('action="store_true"', "default=True")
    assert findings(source) == []


def test_dataloader_pin_memory_found_with_fix():
    assert_finds(LOADER, "dataloader-pin-memory")
    finding = [f for f in lint_source(textwrap.dedent(LOADER)) if f.rule == "dataloader-pin-memory"][0]
    assert finding.fix == "DataLoader(ds, batch_size=8, shuffle=True, pin_memory=True)"
    assert "x.to(device)" in finding.what


@pytest.mark.parametrize(
    "variant",
    [
        LOADER.replace("x, y = x.to(device), y.to(device)", "x, y = x.cuda(), y.cuda()"),
        LOADER.replace("x, y = x.to(device), y.to(device)", "x = x.to('cuda:0')"),
        LOADER.replace(
            "for x, y in loader:\n    x, y = x.to(device), y.to(device)",
            "def train_step(batch):\n    x, y = batch\n    x = x.to(device)\n\nfor batch in loader:\n    train_step(batch)",
        ),
    ],
)
def test_dataloader_pin_memory_cuda_paths(variant):
    assert "dataloader-pin-memory" in rules(variant)


@pytest.mark.parametrize(
    "variant",
    [
        LOADER.replace("shuffle=True)", "shuffle=True, pin_memory=True)"),
        LOADER.replace("shuffle=True)", "shuffle=True, pin_memory=torch.cuda.is_available())"),
        # CPU only: no copy to a CUDA device
        LOADER.replace('torch.device("cuda" if torch.cuda.is_available() else "cpu")', 'torch.device("cpu")'),
        # only the model goes to the GPU; the batches stay on the CPU
        LOADER.replace("    x, y = x.to(device), y.to(device)\n", ""),
    ],
)
def test_dataloader_pin_memory_absent(variant):
    assert "dataloader-pin-memory" not in rules(variant)


PINNED = """
import torch
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=32, num_workers=4, pin_memory=True)
for step, (images, labels) in enumerate(loader):
    images = images.cuda()  # <-
    labels = labels.cuda(non_blocking=True)
"""


def test_non_blocking_copy_found_with_fix():
    assert findings(PINNED) == [("non-blocking-copy", marked_line(PINNED))]
    finding = lint_source(textwrap.dedent(PINNED))[0]
    assert finding.fix == "images.cuda(non_blocking=True)"


def test_non_blocking_copy_fixed():
    fixed = PINNED.replace("images = images.cuda()  # <-", "images = images.cuda(non_blocking=True)")
    assert findings(fixed) == []


def test_loaders_in_a_dict_and_grad_set_per_phase():
    """The transfer-learning tutorial's shape: loaders in a dict, `set_grad_enabled(phase == "train")`."""
    source = """
    import torch

    device = torch.device("cuda:0")
    dataloaders = {x: torch.utils.data.DataLoader(sets[x], batch_size=4, num_workers=4) for x in ["train", "val"]}  # <-
    other = torch.utils.data.DataLoader(extra, batch_size=4, num_workers=4, pin_memory=True)

    def train_model(model, criterion, optimizer):
        for phase in ["train", "val"]:
            if phase == "train":
                model.train()
            else:
                model.eval()
            running_loss = 0.0
            for inputs, labels in dataloaders[phase]:
                inputs = inputs.to(device)
                with torch.set_grad_enabled(phase == "train"):
                    loss = criterion(model(inputs), labels)
                    if phase == "train":
                        loss.backward()
                        optimizer.step()
                running_loss += loss.item() * inputs.size(0)
    """
    # The dict's loader does not pin (reported); its copies are not blamed on the other, pinned loader.
    assert findings(source) == [("dataloader-pin-memory", marked_line(source))]


def test_non_blocking_copy_only_for_batches_of_the_pinned_loader():
    source = """
    import torch
    from torch.utils.data import DataLoader

    device = "cuda"
    train_loader = DataLoader(train_ds, batch_size=32, num_workers=4)
    val_loader = DataLoader(val_ds, batch_size=32, num_workers=4, pin_memory=True)

    def evaluate(model, loader):
        for x, y in loader:
            x = x.to(device)  # <-
            y = y.to(device, non_blocking=True)

    for x, y in train_loader:
        x = x.to(device)                      # pageable loader: its own finding is pin_memory
        weights = torch.ones(3).to(device)    # not batch data
    evaluate(model, val_loader)
    """
    assert ("non-blocking-copy", marked_line(source)) in findings(source)
    assert [rule for rule, _ in findings(source)].count("non-blocking-copy") == 1
    assert [rule for rule, _ in findings(source)].count("dataloader-pin-memory") == 1


# ---------------------------------------------------------------------------------------------------
# Rule: empty-cache-in-loop

EMPTY_CACHE = """
import torch

for epoch in range(3):
    for x, y in train_loader:
        loss = model(x).sum()
        loss.backward()
        torch.cuda.empty_cache()  # <-
"""


def test_empty_cache_in_loop_found():
    assert findings(EMPTY_CACHE) == [("empty-cache-in-loop", marked_line(EMPTY_CACHE))]


@pytest.mark.parametrize(
    "fixed",
    [
        EMPTY_CACHE.replace("        torch.cuda.empty_cache()  # <-\n", ""),
        # once per epoch, after the step loop
        EMPTY_CACHE.replace("        torch.cuda.empty_cache()  # <-", "    torch.cuda.empty_cache()"),
        # once, after training
        EMPTY_CACHE.replace("        torch.cuda.empty_cache()  # <-", "torch.cuda.empty_cache()"),
    ],
)
def test_empty_cache_in_loop_absent(fixed):
    assert "empty-cache-in-loop" not in rules(fixed)


def test_empty_cache_between_benchmark_configurations_not_reported():
    source = """
    import torch

    for batch_size in [32, 64, 128]:
        run_benchmark(batch_size)
        torch.cuda.empty_cache()
    """
    assert findings(source) == []


def test_empty_cache_once_per_epoch_not_reported():
    source = """
    import torch

    def train_one_epoch(model, loader, opt):
        for x, y in loader:
            model(x).sum().backward()
            opt.step()

    for epoch in range(10):
        train_one_epoch(model, loader, opt)
        scheduler.step()
        torch.cuda.empty_cache()
    """
    assert "empty-cache-in-loop" not in rules(source)


def test_empty_cache_in_step_loops():
    source = """
    import torch
    from torch import cuda

    def train_step(batch):
        loss = model(batch).sum()
        loss.backward()

    step = 0
    while step < 100:
        step += 1
        torch.cuda.empty_cache()  # <-

    for batch in batches:
        train_step(batch)
        cuda.empty_cache()
    """
    result = findings(source)
    assert ("empty-cache-in-loop", marked_line(source)) in result
    assert [rule for rule, _ in result] == ["empty-cache-in-loop", "empty-cache-in-loop"]


# ---------------------------------------------------------------------------------------------------
# Whole scripts under tests/lint_cases/: one with every mistake, its corrected version with none.


def test_every_rule_has_a_case_in_the_broken_script():
    result = lint_file(CASES / "broken_train.py")
    assert {f.rule for f in result} == set(RULES)
    lines = (CASES / "broken_train.py").read_text().splitlines()
    for finding in result:
        assert f"expect: {finding.rule}" in lines[finding.line - 1], finding


def test_corrected_script_is_clean():
    assert lint_file(CASES / "fixed_train.py") == []


# ---------------------------------------------------------------------------------------------------
# Findings as data, suppression comments


def test_finding_to_dict_is_the_documented_shape():
    finding = lint_source(textwrap.dedent(LOSS_ACCUMULATION), "train.py")[0]
    data = finding.to_dict()
    assert list(data) == ["file", "line", "col", "rule", "title", "what", "why", "fix"]
    assert data["file"] == "train.py" and data["rule"] == finding.rule
    assert json.loads(json.dumps(data)) == data
    assert finding.location() == f"train.py:{finding.line}:{finding.col}"
    assert isinstance(finding, LintFinding)


def test_rules_registry_is_complete():
    assert list(RULES) == [
        "loss-accumulation",
        "eval-without-no-grad",
        "half-with-batchnorm",
        "data-parallel",
        "dataloader-num-workers",
        "dataloader-pin-memory",
        "non-blocking-copy",
        "empty-cache-in-loop",
    ]
    for rule in RULES.values():
        assert rule.title and rule.why and callable(rule.check)


@pytest.mark.parametrize(
    "comment, left",
    [
        ("# advisor: ignore", set()),
        ("# advisor: ignore[dataloader-num-workers]", {"dataloader-pin-memory"}),
        ("# advisor: ignore[dataloader-num-workers, dataloader-pin-memory]", set()),
        ("# advisor: ignore[something-else]", {"dataloader-num-workers", "dataloader-pin-memory"}),
    ],
)
def test_ignore_comment(comment, left):
    source = LOADER.replace("# <-", comment)
    assert rules(source) == left


def test_syntax_error_is_a_lint_error():
    with pytest.raises(LintError) as info:
        lint_source("for x in:\n    pass\n", "bad.py")
    assert isinstance(info.value, AdvisorError) and info.value.exit_code == 2
    assert str(info.value).startswith("bad.py:1:")
    assert "syntax error" in str(info.value)


# ---------------------------------------------------------------------------------------------------
# Command line: exit codes, --json, errors as one line


@pytest.fixture
def scripts(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text(textwrap.dedent(LOSS_ACCUMULATION))
    clean = tmp_path / "clean.py"
    clean.write_text("import torch\nprint(torch.ones(2).sum().item())\n")
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n    pass\n")
    binary = tmp_path / "binary.py"
    binary.write_bytes(b"\xff\xfe\x00garbage\n")
    empty = tmp_path / "empty_folder"
    empty.mkdir()
    long_sum = tmp_path / "long_sum.py"  # ast.parse: RecursionError during ast construction
    long_sum.write_text("x = " + "+".join(["a"] * 100_000) + "\n")
    long_chain = tmp_path / "long_chain.py"
    long_chain.write_text("x = a" + ".b" * 100_000 + "\n")
    unary = tmp_path / "unary.py"  # ast.parse: MemoryError from the parser's own stack
    unary.write_text("x = " + "-" * 100_000 + "1\n")
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    return {
        "broken": broken, "clean": clean, "bad": bad, "missing": tmp_path / "missing.py",
        "binary": binary, "empty": empty, "long_sum": long_sum, "long_chain": long_chain, "unary": unary,
        "fifo": fifo,
    }


def run_main(argv):
    from advisor.cli import main

    return main(argv)


def test_cli_exit_codes(scripts, capsys):
    assert run_main(["lint", str(scripts["clean"])]) == 0
    assert "No findings" in capsys.readouterr().out
    assert run_main(["lint", str(scripts["broken"])]) == 1
    out = capsys.readouterr().out
    assert f"{scripts['broken']}:{marked_line(LOSS_ACCUMULATION)}:" in out
    assert "loss-accumulation" in out and "total_loss += loss.item()" in out
    assert run_main(["lint", str(scripts["clean"]), str(scripts["broken"])]) == 1


@pytest.mark.parametrize(
    "name, problem",
    [
        ("missing", "no such file"),
        ("bad", "syntax error"),
        ("binary", "cannot decode"),
        ("empty", "no .py files"),
        ("long_sum", "nested too deeply (or is too long) to check"),
        ("long_chain", "nested too deeply (or is too long) to check"),
        ("unary", "nested too deeply (or is too long) to check"),
        ("fifo", "not a regular file"),
    ],
)
def test_cli_bad_input_is_one_line(scripts, capsys, name, problem):
    assert run_main(["lint", str(scripts["clean"]), str(scripts[name])]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing is printed before every input has been read
    assert captured.err.count("\n") == 1
    assert str(scripts[name]) in captured.err and problem in captured.err


def test_tree_too_deep_to_walk_is_a_lint_error():
    """A tree Python parses but a rule cannot walk back recursively (quoting a very deep expression in a
    finding): one LintError naming the file, not a RecursionError."""
    import ast

    source = "from torch.utils.data import DataLoader\nloader = DataLoader(ds, batch_size=4)\n"
    tree = ast.parse(source)
    call = tree.body[1].value
    value = ast.Constant(4)
    for _ in range(sys.getrecursionlimit() * 2):
        value = ast.UnaryOp(op=ast.USub(), operand=value)
    call.keywords[0].value = value  # no source position: the finding quotes it with ast.unparse
    with pytest.raises(LintError, match="deep.py: an expression is nested too deeply"):
        lint.lint_tree(tree, source, "deep.py")


def test_cli_escapes_control_characters(tmp_path, capsys):
    evil = tmp_path / "e\x1b[2Jvil.py"
    evil.write_text("from torch.utils.data import DataLoader\nloader = DataLoader(ds, batch_size=4)\n"
                    "for x in loader:\n    x = x.to('cuda')\n")
    assert run_main(["lint", str(evil)]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "e\\x1b[2Jvil.py:2:" in out


def test_cli_json(scripts, capsys):
    assert run_main(["lint", "--json", str(scripts["broken"]), str(scripts["clean"])]) == 1
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, list) and data
    assert {d["rule"] for d in data} >= {"loss-accumulation"}
    assert all(d["file"] == str(scripts["broken"]) for d in data)
    assert run_main(["lint", "--json", str(scripts["clean"])]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_cli_folder_argument(tmp_path, capsys):
    (tmp_path / "a.py").write_text(textwrap.dedent(PINNED))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text(textwrap.dedent(EMPTY_CACHE))
    assert run_main(["lint", "--json", str(tmp_path)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert {Path(d["file"]).name for d in data} == {"a.py", "b.py"}


def test_cli_folder_skips_hidden_folders_and_environments(tmp_path, capsys):
    (tmp_path / "train.py").write_text("print('clean')\n")
    for folder in (".venv", "venv", "__pycache__"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "broken.py").write_text("def f(:\n")
    assert run_main(["lint", str(tmp_path)]) == 0
    assert "No findings in 1 file" in capsys.readouterr().out


def _advisor_executable() -> Path:
    executable = Path(sys.executable).parent / "advisor"
    if not executable.exists():
        pytest.skip("the advisor console script is not installed (pip install -e .)")
    return executable


def test_console_script_exit_codes(scripts):
    advisor = _advisor_executable()
    clean = subprocess.run([advisor, "lint", scripts["clean"]], capture_output=True, text=True)
    assert clean.returncode == 0, clean.stderr
    broken = subprocess.run([advisor, "lint", "--json", scripts["broken"]], capture_output=True, text=True)
    assert broken.returncode == 1
    assert json.loads(broken.stdout)[0]["rule"] == "loss-accumulation"
    for name in ("bad", "missing"):
        result = subprocess.run([advisor, "lint", scripts[name]], capture_output=True, text=True)
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert result.stderr.startswith(f"advisor: error: {scripts[name]}")


def test_lint_does_not_import_torch(scripts):
    """The check is static: it never runs the script or needs torch."""
    code = (
        "import sys\nfrom advisor.code.lint import lint_file\n"
        f"lint_file({str(scripts['broken'])!r})\nassert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_examples_lint_without_crashing():
    """The repository's own examples: lint runs, and every finding points at real code."""
    examples = sorted((REPO / "examples").glob("**/*.py"))
    if not examples:
        pytest.skip("no examples yet")
    for path in examples:
        for finding in lint_file(path):
            line = path.read_text().splitlines()[finding.line - 1]
            assert line.strip(), finding


def test_module_has_public_api():
    for name in ("lint_source", "lint_file", "add_lint_arguments", "lint_command", "LintFinding", "RULES"):
        assert hasattr(lint, name)


def test_texts_do_not_assume_a_gpu():
    """A script with no CUDA path is not told about CUDA running out of memory or a GPU waiting."""
    source = ("import torch\nfrom torch.utils.data import DataLoader\n\ndef train(model, data, opt):\n"
              "    total = 0\n    for x, y in DataLoader(data, batch_size=8):\n"
              "        loss = torch.nn.functional.mse_loss(model(x), y)\n        loss.backward()\n"
              "        opt.step()\n        total += loss\n    return total\n")
    findings = lint_source(source, "cpu_train.py")
    assert {"loss-accumulation", "dataloader-num-workers"} <= {f.rule for f in findings}
    for f in findings:
        assert "CUDA runs out" not in f.why and "the GPU waits" not in f.why, f
