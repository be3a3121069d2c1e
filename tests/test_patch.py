"""suggested.patch: the final knobs as a unified diff that `patch -p1` and `git apply` accept.

The examples are patched on copies in tmp_path; each diff is checked with the real tools, applied, and
the result compiled. One test runs a patched example for real.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from advisor.errors import AdvisorError
from advisor.trials.knobs import Knobs
from advisor.code.patch import PATCH_NAME, patched_source, suggest_patch, write_patch
from advisor.code.patch.plan import plan_patch
from conftest import run_script, require
from trial_helpers import dataloader_defaults

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
USER_VALUES = {**dataloader_defaults(), "batch_size": 32}

KNOB_SETS = {
    "amp-bf16": Knobs(amp="bf16"),
    "amp-fp16": Knobs(amp="fp16"),
    "batch-size": Knobs(batch_size=64),
    "num-workers": Knobs(num_workers=2),
    "pin-memory": Knobs(pin_memory=True),
    "persistent-workers": Knobs(num_workers=2, persistent_workers=True),
    "prefetch-factor": Knobs(num_workers=2, prefetch_factor=4),
    "non-blocking": Knobs(non_blocking=True),
    "all": Knobs(amp="bf16", batch_size=64, num_workers=2, pin_memory=True, persistent_workers=True,
                 prefetch_factor=4, non_blocking=True),
}


def copy_example(tmp_path: Path, name: str) -> Path:
    """A copy of examples/<name> in tmp_path (the original is never touched)."""
    path = tmp_path / name
    shutil.copyfile(EXAMPLES / name, path)
    return path


def check_applies(root: Path, diff: str) -> None:
    require("patch")
    """`patch -p1 --dry-run` and `git apply --check` both accept the diff, run in root."""
    assert diff.startswith("--- a/") and "\n+++ b/" in diff
    (root / PATCH_NAME).write_text(diff)
    dry = subprocess.run(["patch", "-p1", "--dry-run", "-i", PATCH_NAME], cwd=root, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    if not (root / ".git").exists():
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    check = subprocess.run(["git", "apply", "--check", PATCH_NAME], cwd=root, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def apply(root: Path, diff: str) -> None:
    require("patch")
    """Apply the diff for real with `patch -p1`."""
    (root / PATCH_NAME).write_text(diff)
    done = subprocess.run(["patch", "-p1", "-i", PATCH_NAME], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def patch_text(tmp_path: Path, source: str, knobs: Knobs, user_values: dict | None = None, target: str = "train_step",
               **kwargs) -> tuple[str, str]:
    """Patch a synthetic script: (diff, patched source); the diff is checked with patch and git apply."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    diff = suggest_patch(script, target, knobs, USER_VALUES if user_values is None else user_values, **kwargs)
    after = patched_source(script.read_text(), target, knobs, USER_VALUES if user_values is None else user_values)
    if diff:
        check_applies(tmp_path, diff)
    compile(after, "train.py", "exec")
    return diff, after


def function(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def dataloader_keywords(tree: ast.AST) -> dict[str, str]:
    """Keyword arguments (as source text) of the first DataLoader(...) call."""
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("DataLoader"))
    return {k.arg: ast.unparse(k.value) for k in call.keywords}


def argparse_default(tree: ast.AST, option: str) -> str:
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("add_argument")
                and isinstance(n.args[0], ast.Constant) and n.args[0].value == option)
    return next(ast.unparse(k.value) for k in call.keywords if k.arg == "default")


# --------------------------------------------------------------------------------------------------
# The real examples: every knob alone and all together apply cleanly and compile


@pytest.mark.parametrize("example", ["image_classifier.py", "char_transformer.py"])
@pytest.mark.parametrize("knobs_name", list(KNOB_SETS))
def test_example_patch_applies_and_compiles(tmp_path, example, knobs_name):
    script = copy_example(tmp_path, example)
    original = script.read_text()
    diff = suggest_patch(script, "train_step", KNOB_SETS[knobs_name], USER_VALUES)
    assert diff, "every knob set changes something in the examples"
    assert diff.splitlines()[:2] == [f"--- a/{example}", f"+++ b/{example}"]
    check_applies(tmp_path, diff)
    assert script.read_text() == original, "suggest_patch must not touch the script"
    apply(tmp_path, diff)
    compile(script.read_text(), example, "exec")


def test_image_classifier_all_knobs(tmp_path):
    script = copy_example(tmp_path, "image_classifier.py")
    apply(tmp_path, suggest_patch(script, "train_step", KNOB_SETS["all"], USER_VALUES))
    tree = ast.parse(script.read_text())
    # The loader reads args.batch_size / args.num_workers: their argparse defaults change.
    assert argparse_default(tree, "--batch-size") == "64"
    assert argparse_default(tree, "--num-workers") == "2"
    keywords = dataloader_keywords(tree)
    assert keywords["batch_size"] == "args.batch_size" and keywords["num_workers"] == "args.num_workers"
    assert keywords["pin_memory"] == "True"
    # The worker count is a command-line value: the worker-only arguments follow it.
    assert keywords["persistent_workers"] == "args.num_workers > 0"
    assert keywords["prefetch_factor"] == "4 if args.num_workers > 0 else None"

    step = function(tree, "train_step")
    assert isinstance(step.body[0], ast.Expr) and isinstance(step.body[0].value, ast.Constant), "docstring first"
    # The batch's copies are no forward work (torch's AMP recipe keeps them out of the block too).
    assert ast.unparse(step.body[1]) == ("images, labels = (images.to(device, non_blocking=True), "
                                         "labels.to(device, non_blocking=True))")
    autocast = step.body[2]
    assert isinstance(autocast, ast.With)
    assert ast.unparse(autocast.items[0].context_expr) == (
        "torch.autocast(device_type=device.type, dtype=torch.bfloat16)")
    inside = [ast.unparse(s) for s in autocast.body]
    assert any(s.startswith("loss = F.cross_entropy(") for s in inside), "the forward and loss are inside"
    assert inside[-1].startswith("loss = "), "the block ends with the loss: zero_grad is no forward work"
    after = [ast.unparse(s) for s in step.body[3:]]
    assert after == ["optimizer.zero_grad(set_to_none=True)", "loss.backward()", "optimizer.step()",
                     "return loss.detach()"], "backward runs outside autocast"


def test_non_blocking_only_in_the_step(tmp_path):
    script = copy_example(tmp_path, "image_classifier.py")
    apply(tmp_path, suggest_patch(script, "train_step", Knobs(non_blocking=True), USER_VALUES))
    tree = ast.parse(script.read_text())
    step = function(tree, "train_step")
    copies = [n for n in ast.walk(step) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith(".to")]
    assert len(copies) == 2
    assert all(ast.unparse(c) .endswith("(device, non_blocking=True)") for c in copies)
    elsewhere = [n for n in ast.walk(function(tree, "main")) if isinstance(n, ast.Call)]
    assert not any(k.arg == "non_blocking" for c in elsewhere for k in c.keywords), "model.to(device) untouched"


def test_char_transformer_loader_gets_literal_keywords(tmp_path):
    script = copy_example(tmp_path, "char_transformer.py")
    knobs = Knobs(num_workers=2, persistent_workers=True, prefetch_factor=4)
    apply(tmp_path, suggest_patch(script, "train_step", knobs, USER_VALUES))
    keywords = dataloader_keywords(ast.parse(script.read_text()))
    # num_workers was not passed at all: it is added as a keyword, so the worker count is static.
    assert keywords["num_workers"] == "2"
    assert keywords["persistent_workers"] == "True" and keywords["prefetch_factor"] == "4"
    assert max(len(line) for line in script.read_text().splitlines()) <= 120


def test_fp16_on_example(tmp_path):
    script = copy_example(tmp_path, "char_transformer.py")
    apply(tmp_path, suggest_patch(script, "train_step", Knobs(amp="fp16"), USER_VALUES))
    tree = ast.parse(script.read_text())
    module_level = [ast.unparse(s) for s in tree.body]
    assert "scaler = torch.amp.GradScaler('cuda')" in module_level
    last_import = max(i for i, s in enumerate(tree.body) if isinstance(s, (ast.Import, ast.ImportFrom)))
    assert module_level.index("scaler = torch.amp.GradScaler('cuda')") == last_import + 1
    step = function(tree, "train_step")
    assert ast.unparse(step.body[1]) == "tokens, targets = (tokens.to(device), targets.to(device))"
    assert ast.unparse(step.body[2].items[0].context_expr) == (
        "torch.autocast(device_type='cuda', dtype=torch.float16)")
    assert [ast.unparse(s) for s in step.body[3:]] == [
        "optimizer.zero_grad(set_to_none=True)", "scaler.scale(loss).backward()", "scaler.step(optimizer)", "scaler.update()", "return loss.detach()"]


def test_paths_relative_to_root(tmp_path):
    (tmp_path / "examples").mkdir()
    script = copy_example(tmp_path / "examples", "image_classifier.py")
    diff = suggest_patch(script, "train_step", Knobs(batch_size=64), USER_VALUES, root=tmp_path)
    assert diff.splitlines()[:2] == ["--- a/examples/image_classifier.py", "+++ b/examples/image_classifier.py"]
    check_applies(tmp_path, diff)
    with pytest.raises(AdvisorError, match="not inside"):
        suggest_patch(script, "train_step", Knobs(batch_size=64), USER_VALUES, root=tmp_path / "elsewhere")


def test_write_patch(tmp_path):
    script = copy_example(tmp_path, "image_classifier.py")
    out = tmp_path / "run"
    out.mkdir()
    written, notes = write_patch(script, "train_step", Knobs(num_workers=2), USER_VALUES, out)
    assert written == out / PATCH_NAME and "+    parser.add_argument(\"--num-workers\"" in written.read_text()
    assert notes == []
    assert write_patch(script, "train_step", Knobs(num_workers=0), USER_VALUES, out / "x") == (None, [])


@pytest.mark.slow
def test_patched_example_runs(tmp_path):
    """batch 64, 2 workers, bf16 autocast written into the example; the patched script trains for real."""
    script = copy_example(tmp_path, "image_classifier.py")
    if (EXAMPLES / "data" / "shapes").is_dir():  # the images already generated: nothing is regenerated
        (tmp_path / "data").symlink_to(EXAMPLES / "data")
    apply(tmp_path, suggest_patch(script, "train_step", Knobs(amp="bf16", batch_size=64, num_workers=2),
                                  USER_VALUES))
    run = run_script(script, "--epochs", "1", cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    # 384 images at batch 64 (drop_last) is 6 steps: the example prints steps 0 and 4, never 8.
    assert "epoch 0 step 4 loss" in run.stdout and "step 8" not in run.stdout, run.stdout


# --------------------------------------------------------------------------------------------------
# Synthetic scripts


LOADER_SCRIPT = """\
    import torch
    from torch.utils.data import DataLoader

    BATCH = 32


    def train_step(model, optimizer, x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss


    def main(dataset):
        loader = DataLoader(dataset, {batch}, shuffle=True)
"""


def test_positional_batch_size(tmp_path):
    diff, after = patch_text(tmp_path, LOADER_SCRIPT.format(batch="32"), Knobs(batch_size=64))
    assert "-    loader = DataLoader(dataset, 32, shuffle=True)" in diff
    assert "+    loader = DataLoader(dataset, 64, shuffle=True)" in diff


def test_batch_size_module_constant(tmp_path):
    diff, after = patch_text(tmp_path, LOADER_SCRIPT.format(batch="batch_size=BATCH"), Knobs(batch_size=64))
    assert "-BATCH = 32\n+BATCH = 64\n" in diff
    assert "DataLoader(dataset, batch_size=BATCH, shuffle=True)" in after
    assert diff.count("\n+") == 2  # the header and the one line


def test_batch_size_name_falls_back_to_literal_with_comment(tmp_path):
    # The constant says 32 but the trial saw 16 (set elsewhere): the literal says what was measured.
    diff, after = patch_text(tmp_path, LOADER_SCRIPT.format(batch="batch_size=BATCH"), Knobs(batch_size=64),
                             dict(USER_VALUES, batch_size=16))
    assert "DataLoader(dataset, batch_size=64, shuffle=True)  # advisor: was batch_size=BATCH" in after
    assert "BATCH = 32" in after
    source = LOADER_SCRIPT.format(batch="batch_size=size").replace("def main(dataset):", "def main(dataset, size):")
    diff, after = patch_text(tmp_path, source, Knobs(batch_size=64))
    assert "batch_size=64, shuffle=True)  # advisor: was batch_size=size" in after


def test_argparse_default(tmp_path):
    source = """\
        import argparse
        import torch
        from torch import utils


        def train_step(model, batch):
            return model(batch).sum()


        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("-b", "--batch-size", type=int, default=32, help="per step")
            parser.add_argument("--workers", dest="loader_workers", type=int, default=0)
            opts = parser.parse_args()
            loader = utils.data.DataLoader(
                range(100),
                batch_size=opts.batch_size,
                num_workers=opts.loader_workers,
            )
    """
    diff, after = patch_text(tmp_path, source, Knobs(batch_size=128, num_workers=4, persistent_workers=True))
    tree = ast.parse(after)
    assert argparse_default(tree, "-b") == "128"
    assert 'parser.add_argument("--workers", dest="loader_workers", type=int, default=4)' in after
    # A trailing-comma call keeps one argument per line.
    assert "        num_workers=opts.loader_workers,\n        persistent_workers=opts.loader_workers > 0,\n    )" in after


MNIST_SHAPED = """\
    import argparse
    import torch


    def train(model, loader, optimizer):
        for data, target in loader:
            optimizer.zero_grad()
            model(data).sum().backward()
            optimizer.step()


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument('--batch-size', type=int, default=64, metavar='N',
                            help='input batch size for training (default: 64)')
        parser.add_argument('--test-batch-size', type=int, default=1000, metavar='N',
                            help='input batch size for testing (default: 1000)')
        args = parser.parse_args()
        use_cuda = torch.cuda.is_available()
        train_kwargs = {'batch_size': args.batch_size}
        test_kwargs = {'batch_size': args.test_batch_size}
        if use_cuda:
            cuda_kwargs = {'num_workers': 1, 'pin_memory': True, 'shuffle': True}
            train_kwargs.update(cuda_kwargs)
            test_kwargs.update(cuda_kwargs)
        {later}
        train_loader = torch.utils.data.DataLoader(range(100), **train_kwargs)
"""


@pytest.mark.parametrize("later", ["pass", "train_kwargs.update({'batch_size': 32})", "train_kwargs['batch_size'] = 32",
                                   "train_kwargs |= {'batch_size': 32}", "train_kwargs.update(**other)",
                                   "train_kwargs.pop('batch_size')"])
def test_a_loader_set_from_a_dict_of_keywords_is_patched_where_the_dict_takes_its_value(tmp_path, later):
    """pytorch/examples' MNIST (the script most PyTorch scripts grew from) builds its loader with
    `DataLoader(dataset, **train_kwargs)`, `train_kwargs = {'batch_size': args.batch_size}`: the patch merged the new
    size into the call (`**{**train_kwargs, "batch_size": 256}`) where the script's own place for it is the
    `--batch-size` default. Where something after could set the entry (an update from a mapping that has it, or
    from one the source does not show, an item set), the merge stays: it is right whatever the dict holds."""
    knobs = Knobs(batch_size=256, num_workers=2, persistent_workers=True)
    diff, after = patch_text(tmp_path, MNIST_SHAPED.replace("{later}", later), knobs,
                             dict(USER_VALUES, batch_size=64, num_workers=0), target="train")
    tree = ast.parse(after)
    loader = next(n for n in ast.walk(tree)
                  if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "train_loader")
    # The workers: the CUDA branch's update sets them, so they are merged into the call whatever the source says.
    assert "'num_workers': 2, 'persistent_workers': True" in ast.unparse(loader.value), ast.unparse(loader.value)
    assert argparse_default(tree, "--test-batch-size") == "1000"
    if later == "pass":
        assert argparse_default(tree, "--batch-size") == "256"
        # Its help says the default in words: it says the new one (the test batch's is left as it was).
        assert "help='input batch size for training (default: 256)')" in after, after
        assert "help='input batch size for testing (default: 1000)')" in after
        assert "'batch_size'" not in ast.unparse(loader.value)
    else:
        assert argparse_default(tree, "--batch-size") == "64"
        assert "'batch_size': 256" in ast.unparse(loader.value), ast.unparse(loader.value)


def test_fp16_grad_scaler_rewrite(tmp_path):
    source = '''\
        import torch
        import torch.nn as nn

        model = nn.Linear(4, 1).cuda()
        opt = torch.optim.Adam(model.parameters())
        sched = torch.optim.lr_scheduler.StepLR(opt, 10)


        def train_step(x, y):
            """One step."""
            x = x.cuda()
            out = model(x)
            loss = ((out - y.cuda()) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            return loss
    '''
    diff, after = patch_text(tmp_path, source, Knobs(amp="fp16"))
    assert 'import torch.nn as nn\n\nscaler = torch.amp.GradScaler("cuda")\n\nmodel = ' in after
    assert textwrap.dedent('''\
        def train_step(x, y):
            """One step."""
            x = x.cuda()
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                out = model(x)
                loss = ((out - y.cuda()) ** 2).mean()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()
            return loss
    ''') in after


def test_autocast_covers_the_forward_not_the_copies_and_zero_grad_before_it(tmp_path):
    # pytorch/examples' MNIST `train`: the batch's copies and zero_grad come before the forward.
    source = """\
        import torch
        import torch.nn.functional as F


        def train(args, model, device, train_loader, optimizer, epoch):
            model.train()
            for batch_idx, (data, target) in enumerate(train_loader):
                data, target = data.to(device), target.to(device)
                optimizer.zero_grad()
                output = model(data)
                loss = F.nll_loss(output, target)
                loss.backward()
                optimizer.step()
    """
    diff, after = patch_text(tmp_path, source, Knobs(amp="bf16"), target="train")
    assert textwrap.dedent("""\
            for batch_idx, (data, target) in enumerate(train_loader):
                data, target = data.to(device), target.to(device)
                optimizer.zero_grad()
                with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
                    output = model(data)
                    loss = F.nll_loss(output, target)
                loss.backward()
                optimizer.step()
    """) in textwrap.dedent(after.split("model.train()\n", 1)[1]), after


def test_a_loop_at_the_scripts_top_level_gets_autocast_around_each_forward(tmp_path):
    # nanoGPT's train.py trains at the top level, with no step function: the steps are found where the optimizer
    # steps, and the one loop that calls backward is where autocast and the copies are written.
    source = """\
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = torch.nn.Linear(8, 1).to(device)
        optimizer = torch.optim.AdamW(model.parameters())


        def get_batch():
            return torch.randn(4, 8), torch.randn(4, 1)


        if __name__ == "__main__":
            for it in range(100):
                x, y = get_batch()
                x, y = x.to(device), y.to(device)
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    """
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    apply(tmp_path, suggest_patch(script, None, Knobs(amp="bf16", non_blocking=True), USER_VALUES))
    after = script.read_text()
    assert textwrap.dedent("""\
        if __name__ == "__main__":
            for it in range(100):
                with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
                    x, y = get_batch()
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
    """) in after, after
    script.write_text(textwrap.dedent(source))
    fp16 = plan_patch(script, None, Knobs(amp="fp16"), USER_VALUES)  # the GradScaler needs a step's bounds
    assert not fp16.diff and any(note.startswith("amp=fp16 is not written") for note in fp16.notes), fp16.notes


def test_fp16_without_optimizer_step_leaves_backward_unscaled(tmp_path):
    # The step is outside the target: scaled gradients would reach an unscaled optimizer.step.
    source = """\
        import torch


        def train_step(model, x):
            loss = model(x).sum()
            loss.backward()
            return loss
    """
    diff, after = patch_text(tmp_path, source, Knobs(amp="fp16"))
    assert "GradScaler" not in after and "    loss.backward()" in after
    assert 'with torch.autocast(device_type="cuda", dtype=torch.float16):\n        loss = model(x).sum()' in after


def test_class_method_target(tmp_path):
    source = """\
        import torch


        def step(batch):
            return batch.to("cuda")


        class Trainer:
            def __init__(self, model):
                self.model = model.to("cuda")
                self.device = torch.device("cuda")

            def step(self, batch):
                batch = batch.to(self.device)
                self.model.to(self.device)
                loss = self.model(batch).float().to(torch.float16).sum()
                loss.backward()
                return loss
    """
    diff, after = patch_text(tmp_path, source, Knobs(amp="bf16", non_blocking=True), target="Trainer.step")
    assert 'def step(batch):\n    return batch.to("cuda")\n' in after, "the function of the same name is untouched"
    assert textwrap.indent(textwrap.dedent("""\
        def step(self, batch):
            batch = batch.to(self.device, non_blocking=True)
            with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
                self.model.to(self.device)
                loss = self.model(batch).float().to(torch.float16).sum()
            loss.backward()
            return loss
    """), "    ") in after


def test_target_not_found(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("def step():\n    pass\n\n\nclass A:\n    def run(self):\n        pass\n")
    with pytest.raises(AdvisorError, match=r"train\.py: cannot patch: no function 'train_step' is defined "
                                           r"\(functions found: A\.run, step\)"):
        suggest_patch(script, "train_step", Knobs(amp="bf16"), USER_VALUES)
    with pytest.raises(AdvisorError, match="cannot patch: no function 'B.run'"):
        suggest_patch(script, "B.run", Knobs(amp="bf16"), USER_VALUES)


def test_no_change_gives_empty_diff(tmp_path):
    source = LOADER_SCRIPT.format(batch="batch_size=32")
    diff, after = patch_text(tmp_path, source, Knobs(batch_size=32, num_workers=0, pin_memory=False))
    assert diff == "" and after == textwrap.dedent(source)
    # persistent_workers=True without workers is not valid DataLoader input: nothing to write.
    diff, _ = patch_text(tmp_path, source, Knobs(persistent_workers=True, prefetch_factor=4))
    assert diff == ""
    diff, _ = patch_text(tmp_path, source, Knobs())
    assert diff == ""


def test_fewer_workers_drops_worker_only_arguments(tmp_path):
    source = LOADER_SCRIPT.format(batch="32, num_workers=4, persistent_workers=True, prefetch_factor=8")
    diff, after = patch_text(tmp_path, source, Knobs(num_workers=0),
                             dict(USER_VALUES, num_workers=4, persistent_workers=True, prefetch_factor=8))
    assert "loader = DataLoader(dataset, 32, num_workers=0, shuffle=True)" in after


def test_dataloader_positions(tmp_path):
    # DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory)
    source = LOADER_SCRIPT.format(batch="16, True, None, None, 0, None, False").replace(", shuffle=True", "")
    diff, after = patch_text(tmp_path, source, Knobs(batch_size=64, num_workers=3, pin_memory=True))
    assert "DataLoader(dataset, 64, True, None, None, 3, None, True)" in after
    source = LOADER_SCRIPT.format(batch="batch_sampler=sampler")
    diff, after = patch_text(tmp_path, source, Knobs(batch_size=64))
    assert diff == "", "a batch_sampler decides the batch: batch_size does not apply"


def test_non_blocking_skips_dtype_and_module_copies(tmp_path):
    source = """\
        import torch

        DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


        def train_step(net, x, y, mask):
            net.to(DEVICE)
            x = x.to(DEVICE).to(torch.bfloat16)
            y = y.to(device=DEVICE, dtype=torch.long)
            mask = mask.cuda(0)
            z = x.to(y)
            w = x.to(DEVICE, torch.float16, True)
            return net(x, y, mask, z, w).sum()
    """
    diff, after = patch_text(tmp_path, source, Knobs(non_blocking=True, amp="bf16"))
    assert "net.to(DEVICE)\n" in after
    assert "x = x.to(DEVICE, non_blocking=True).to(torch.bfloat16)" in after
    assert "y = y.to(device=DEVICE, dtype=torch.long, non_blocking=True)" in after
    assert "mask = mask.cuda(0, non_blocking=True)" in after
    assert "z = x.to(y, non_blocking=True)" in after
    assert "w = x.to(DEVICE, torch.float16, True)" in after
    # No backward: the whole body is under autocast; the module's device string gives the device type.
    assert "with torch.autocast(device_type=torch.device(DEVICE).type, dtype=torch.bfloat16):\n        net.to" in after


def test_gradient_accumulation_shape_and_behaviour(tmp_path):
    source = """\
        LOG = []


        class Loss:
            def __init__(self, value):
                self.value = value

            def __truediv__(self, n):
                return Loss(self.value / n)

            def backward(self):
                LOG.append(("backward", self.value))


        class Optimizer:
            def zero_grad(self):
                LOG.append("zero_grad")

            def step(self):
                LOG.append("step")


        def train_step(optimizer, value):
            # the forward
            loss = Loss(value)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss
    """
    diff, after = patch_text(tmp_path, source, Knobs(accumulation_steps=2))
    assert "ACCUMULATION_STEPS = 2" in after and "(loss / ACCUMULATION_STEPS).backward()" in after
    namespace: dict = {}
    exec(compile(after, "train.py", "exec"), namespace)
    optimizer = namespace["Optimizer"]()
    returned = [namespace["train_step"](optimizer, v).value for v in (2.0, 4.0, 6.0, 8.0)]
    assert returned == [2.0, 4.0, 6.0, 8.0], "the returned loss is the user's, not the divided one"
    assert namespace["LOG"] == [
        "zero_grad", ("backward", 1.0), ("backward", 2.0), "step",
        "zero_grad", ("backward", 3.0), ("backward", 4.0), "step",
    ]


def test_file_without_final_newline(tmp_path):
    source = LOADER_SCRIPT.format(batch="32").rstrip("\n")
    diff, after = patch_text(tmp_path, source, Knobs(batch_size=8))
    assert diff.endswith("\n\\ No newline at end of file\n")
    assert after.endswith("shuffle=True)")


def test_dataloader_with_double_star_options(tmp_path):
    source = LOADER_SCRIPT.format(batch="**options").replace("def main(dataset):", "def main(dataset, options):")
    diff, after = patch_text(tmp_path, source, Knobs(batch_size=64, persistent_workers=True))
    # The mapping may hold these already: merging never passes a keyword twice.
    assert ('DataLoader(dataset, **{**options, "batch_size": 64, '
            '"persistent_workers": options.get("num_workers", 0) > 0}, shuffle=True)') in after


def test_crlf_script(tmp_path):
    require("patch")
    script = tmp_path / "train.py"
    script.write_bytes(textwrap.dedent(LOADER_SCRIPT.format(batch="32")).replace("\n", "\r\n").encode())
    diff = suggest_patch(script, "train_step", Knobs(amp="bf16", num_workers=2), USER_VALUES)
    (tmp_path / PATCH_NAME).write_bytes(diff.encode())
    done = subprocess.run(["patch", "-p1", "-i", PATCH_NAME], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    patched = script.read_bytes()
    assert b"\r\n" in patched and b"\n" not in patched.replace(b"\r\n", b"")
    assert b'DataLoader(dataset, 32, shuffle=True, num_workers=2)' in patched


def test_fp16_with_accumulation_on_example(tmp_path):
    script = copy_example(tmp_path, "image_classifier.py")
    diff = suggest_patch(script, "train_step", Knobs(amp="fp16", accumulation_steps=4), USER_VALUES)
    check_applies(tmp_path, diff)
    apply(tmp_path, diff)
    tree = ast.parse(script.read_text())
    assert "ACCUMULATION_STEPS = 4" in [ast.unparse(s) for s in tree.body]
    step = function(tree, "train_step")
    assert [ast.unparse(s) for s in step.body[1:5]] == [
        "global accumulation_micro_step",
        "first_micro_step = accumulation_micro_step % ACCUMULATION_STEPS == 0",
        "last_micro_step = accumulation_micro_step % ACCUMULATION_STEPS == ACCUMULATION_STEPS - 1",
        "accumulation_micro_step += 1",
    ]
    assert ast.unparse(step.body[5]).startswith("images, labels = (images.to(device)")  # no forward work
    assert isinstance(step.body[6], ast.With)
    assert [ast.unparse(s) for s in step.body[7:]] == [
        "if first_micro_step:\n    optimizer.zero_grad(set_to_none=True)",
        "scaler.scale(loss / ACCUMULATION_STEPS).backward()",
        "if last_micro_step:\n    scaler.step(optimizer)\n    scaler.update()",
        "return loss.detach()",
    ]


def test_device_type_decided_at_run_time_and_torch_imported(tmp_path):
    source = """\
        from torch import nn


        def train_step(model, x):
            return model(x).sum()


        def main():
            dev = "cuda" if nn.Module else "cpu"
    """
    diff, after = patch_text(tmp_path, source, Knobs(amp="bf16"))
    assert after.startswith("from torch import nn\nimport torch\n\n\ndef train_step")
    assert 'with torch.autocast(device_type="cuda" if torch.cuda.is_available() else "cpu", dtype=torch.bfloat16)' \
        in after
    diff, after = patch_text(tmp_path, source.replace('"cuda"', '"mps"'), Knobs(amp="bf16"))
    assert 'torch.autocast(device_type="cpu", dtype=torch.bfloat16)' in after


def test_worker_only_defaults_are_left_alone(tmp_path):
    source = LOADER_SCRIPT.format(batch="32, num_workers=0, persistent_workers=False, prefetch_factor=None")
    diff, after = patch_text(tmp_path, source, Knobs(batch_size=48))
    assert "DataLoader(dataset, 48, num_workers=0, persistent_workers=False, prefetch_factor=None, shuffle=True)" \
        in after


def test_fp16_without_scalable_backward_has_no_scaler(tmp_path):
    # scaler.step would unscale gradients that were never scaled: no GradScaler at all.
    source = """\
        import torch


        def train_step(model, optimizer, x):
            loss = model(x).sum()
            torch.autograd.backward(loss)
            optimizer.step()
    """
    diff, after = patch_text(tmp_path, source, Knobs(amp="fp16"))
    assert "    torch.autograd.backward(loss)\n    optimizer.step()\n" in after and "scaler" not in after


def test_target_with_its_own_loop(tmp_path):
    source = """\
        import torch


        def train(model, optimizer, loader, device):
            model.train()
            for images, target in loader:
                images = images.to(device)
                output = model(images)
                loss = torch.nn.functional.cross_entropy(output, target.to(device))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    """
    diff, after = patch_text(tmp_path, source, Knobs(amp="bf16", non_blocking=True), target="train")
    assert textwrap.dedent("""\
        def train(model, optimizer, loader, device):
            model.train()
            for images, target in loader:
                images = images.to(device, non_blocking=True)
                with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
                    output = model(images)
                    loss = torch.nn.functional.cross_entropy(output, target.to(device, non_blocking=True))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    """) in after


def test_accumulation_in_a_loop_target(tmp_path):
    source = """\
        def train(optimizer, losses):
            \"\"\"All the steps.\"\"\"

            # one step per item
            for loss in losses:
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    """
    diff, after = patch_text(tmp_path, source, Knobs(accumulation_steps=3), target="train")
    assert textwrap.dedent('''\
        def train(optimizer, losses):
            """All the steps."""

            # one step per item
            global accumulation_micro_step
            for loss in losses:
                first_micro_step = accumulation_micro_step % ACCUMULATION_STEPS == 0
                last_micro_step = accumulation_micro_step % ACCUMULATION_STEPS == ACCUMULATION_STEPS - 1
                accumulation_micro_step += 1
                if first_micro_step:
                    optimizer.zero_grad()
                (loss / ACCUMULATION_STEPS).backward()
                if last_micro_step:
                    optimizer.step()
    ''') in after


def test_ddp_arguments_are_written_into_the_distributed_data_parallel_call(tmp_path):
    script = copy_example(tmp_path, "ddp_classifier.py")
    user = {"ddp_bucket_cap_mb": 25, "ddp_gradient_as_bucket_view": False, "ddp_find_unused_parameters": False}
    diff = suggest_patch(script, "train_step", Knobs(ddp_bucket_cap_mb=10, ddp_gradient_as_bucket_view=True,
                                                     ddp_find_unused_parameters=False), user)
    assert "+    model = DistributedDataParallel(model, bucket_cap_mb=10, gradient_as_bucket_view=True)" in diff
    assert "find_unused_parameters" not in diff  # the script's own value already
    check_applies(tmp_path, diff)
    apply(tmp_path, diff)
    compile(script.read_text(), "ddp_classifier.py", "exec")
    # A script that wraps no model says where the arguments go instead.
    (tmp_path / "plain").mkdir()
    plain = copy_example(tmp_path / "plain", "image_classifier.py")
    patch = plan_patch(plain, "train_step", Knobs(ddp_static_graph=True), USER_VALUES)
    assert patch.diff == "" and any("static_graph=True" in n for n in patch.notes)


def test_threads_are_set_only_where_no_gpu_is(tmp_path):
    """The threads knob was measured on the CPU beside the loader's workers: the patch sets it under a guard,
    so that the same script on a GPU machine keeps torch's default threads."""
    script = copy_example(tmp_path, "image_classifier.py")
    apply(tmp_path, suggest_patch(script, "train_step", Knobs(num_workers=2, persistent_workers=True, threads=1),
                                  USER_VALUES))
    tree = ast.parse(script.read_text())
    guards = [s for s in tree.body if isinstance(s, ast.If) and "set_num_threads" in ast.unparse(s)]
    assert len(guards) == 1
    assert ast.unparse(guards[0].test) == "not torch.cuda.is_available()"
    assert [ast.unparse(s) for s in guards[0].body] == ["torch.set_num_threads(1)"]
    assert not any("set_num_threads" in ast.unparse(s) for s in tree.body if not isinstance(s, ast.If))


GAN = """
    import torch
    from torch import nn, optim

    netG = nn.Sequential(nn.ConvTranspose2d(8, 3, 4, 2, 1), nn.Tanh())
    netD = nn.Sequential(nn.Conv2d(3, 8, 4, 2, 1), nn.Flatten(), nn.Linear(8 * 4 * 4, 1))
    optimizerD = optim.Adam(netD.parameters(), lr=2e-4)
    optimizerG = optim.Adam(netG.parameters(), lr=2e-4)
    extra = optim.SGD(netD.parameters(), lr=0.1)  # the same model again: its lines are written once


    def train_step(noise, real):
        loss_fn = nn.BCEWithLogitsLoss()
        optimizerD.zero_grad()
        fake = netG(noise)
        d_loss = loss_fn(netD(real), torch.ones(len(real), 1)) + loss_fn(netD(fake.detach()), torch.zeros(len(real), 1))
        d_loss.backward()
        optimizerD.step()
        optimizerG.zero_grad()
        g_loss = loss_fn(netD(fake), torch.ones(len(real), 1))
        g_loss.backward()
        optimizerG.step()
        return g_loss.detach()


    if __name__ == "__main__":
        for _ in range(2):
            train_step(torch.randn(4, 8, 4, 4), torch.randn(4, 3, 8, 8))
        conv = (netG[0].weight, netD[0].weight)
        print(all(w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous() for w in conv))
"""


def test_each_model_of_a_gan_gets_its_lines_before_its_own_optimizer(tmp_path):
    """Two models, each with its optimizer (pytorch/examples' DCGAN: netD, then netG): the trial applies
    channels_last and compile to each model it calls, so the patch writes each model's lines before its first
    optimizer, not the first model's alone (DCGAN's patch compiled netD and left netG eager)."""
    script = tmp_path / "train.py"
    for knobs in (Knobs(channels_last=True, compile=True), Knobs(channels_last=True)):
        script.write_text(textwrap.dedent(GAN))
        apply(tmp_path, suggest_patch(script, "train_step", knobs, USER_VALUES))
        lines = [line.strip() for line in script.read_text().splitlines()]
        for model, optimizer in (("netD", "optimizerD"), ("netG", "optimizerG")):
            at = lines.index(f"{optimizer} = optim.Adam({model}.parameters(), lr=2e-4)")
            placed = lines[at - 2:at] if knobs.compile else lines[at - 1:at]
            assert placed[0].startswith(f"{model} = {model}.to(memory_format=torch.channels_last)"), lines
            assert not knobs.compile or placed[1].startswith(f"{model}.compile()"), lines
        assert sum(line.startswith("netD = netD.to(") for line in lines) == 1
    # The patched script runs (channels_last alone: compiling is the compile knob's tests'), each model NHWC.
    done = run_script(script, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip().endswith("True"), done.stdout


SAVES_ITS_MODEL = """
    import io

    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


    def train_step(x):
        optimizer.zero_grad()
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        return loss.detach()


    if __name__ == "__main__":
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        with torch.serialization.safe_globals([nn.Sequential, nn.Linear]):  # its own classes, as torch asks
            loaded = torch.load(buffer)
        print(type(model).__name__, type(loaded).__name__, sorted(model.state_dict()))
"""


def test_the_compiled_model_is_still_the_scripts_own_to_save_and_load(tmp_path):
    """pytorch/examples' word_language_model saves its whole model and loads it back allowing its own classes:
    patched with `model = torch.compile(model)` it saved an OptimizedModule the load refused, at the end of
    training. The patch compiles in place (`model.compile()`): the same class, the same state_dict keys."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SAVES_ITS_MODEL))
    apply(tmp_path, suggest_patch(script, "train_step", Knobs(compile=True), USER_VALUES))
    assert "model.compile()" in script.read_text()
    done = run_script(script, cwd=tmp_path)
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip().splitlines()[-1] == "Sequential Sequential ['0.bias', '0.weight']", done.stdout
