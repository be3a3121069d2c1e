"""The uint8_copies knob: the Dataset hands out 8-bit images and the step's `.to(...)` converts and normalizes
them. For each Dataset shape it recognises, the batches the step receives are the same numbers as without it
(float32, and bf16 as autocast makes them); the shapes it cannot move without changing the data are not
applicable, with the reason; a real trial of the image classifier learns exactly as without it; the patch
writes it and the patched script runs."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader

from advisor.trials.knobs import APPLIED, Knobs
from advisor.trials.process.runner import run_trial
from advisor.trials.interposition.uint8_copies import BytePlan, ByteCopies, byte_plan, mark
from conftest import ROOT, run_script
from trial_helpers import apply_bytes_patch

DATASETS = '''
import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

RNG = np.random.default_rng(0)
PIXELS = RNG.integers(0, 256, (8, 12, 10, 3), dtype=np.uint8)


class PilNormalized(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        image = Image.fromarray(PIXELS[i])
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
        pixels = (pixels - 0.5) / 0.25
        return pixels, i % 3


class NumpyFloat32(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        x = torch.from_numpy(np.float32(PIXELS[i]) / 255.0)
        return x


class Astype(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        label = i % 2
        x = torch.from_numpy(PIXELS[i].astype(np.float32) / 255.0).permute(2, 0, 1).contiguous()
        return label, x


class TensorFloat(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        t = torch.from_numpy(PIXELS[i]).permute(2, 0, 1)
        x = t.float() / 255
        x = (x - 0.45) / 0.226
        return x, i


class Jittered(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        x = torch.from_numpy(np.asarray(PIXELS[i], dtype=np.float32) / 255.0)
        x = x * float(RNG.uniform(0.8, 1.2))
        return x, i


class Branch(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i >= 0:
            x = torch.from_numpy(np.float32(PIXELS[i]) / 255.0)
        return x, i
'''


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds") / "shapes_of_datasets.py"
    path.write_text(textwrap.dedent(DATASETS))
    spec = importlib.util.spec_from_file_location("shapes_of_datasets", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["shapes_of_datasets"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, index, normalized", [("PilNormalized", 0, True), ("NumpyFloat32", None, False),
                                                     ("Astype", 1, False), ("TensorFloat", 0, True)])
def test_the_same_numbers_reach_the_step(datasets, name, index, normalized):
    cls = getattr(datasets, name)
    before = [b for b in DataLoader(cls(), batch_size=4)]
    plan = byte_plan(cls)
    assert isinstance(plan, BytePlan), plan
    assert plan.index == index and (plan.mean is not None) == normalized and plan.scale == 255.0
    original = cls.__getitem__
    cls.__getitem__ = plan.function
    try:
        after = [b for b in DataLoader(cls(), batch_size=4)]
    finally:
        cls.__getitem__ = original
    copies = ByteCopies(True)
    moved_to = copies.to(torch.Tensor.to)
    for old, new in zip(before, after):
        image_old = old if index is None else old[index]
        image_new = new if index is None else new[index]
        assert image_new.dtype == torch.uint8 and image_new.element_size() * 4 == image_old.element_size()
        mark(new, plan)
        got = moved_to(image_new, "cpu")  # the step's .to(device): the copy, then the conversion
        assert got.dtype == torch.float32 and torch.equal(got, image_old)
        assert torch.equal(got.to(torch.bfloat16), image_old.to(torch.bfloat16))
        if index is not None:  # the rest of the batch is untouched
            assert all(torch.equal(a, b) for i, (a, b) in enumerate(zip(old, new)) if i != index)
    assert copies.converted == len(before)
    # A .to() that changes the dtype itself converts from the 8-bit image first: the numbers stay the same.
    mark(after[0], plan)
    image = after[0] if index is None else after[0][index]
    reference = before[0] if index is None else before[0][index]
    assert torch.equal(moved_to(image, torch.float64), reference.to(torch.float64))


@pytest.mark.parametrize("name, reason", [
    ("Jittered", "changes the float image after the conversion (`x = x * float(RNG.uniform(0.8, 1.2))`)"),
    ("Branch", "makes no float image in a way recognised without running it"),
])
def test_what_would_change_the_data_is_not_applicable(datasets, name, reason):
    plan = byte_plan(getattr(datasets, name))
    assert isinstance(plan, str) and reason in plan


def test_a_real_trial_learns_exactly_as_without_the_knob_and_the_patch_runs(tmp_path):
    """The image classifier with two workers, with and without 8-bit copies: the same loss at every step."""
    root = tmp_path / "copy"
    shutil.copytree(ROOT / "examples", root / "examples", ignore=shutil.ignore_patterns("*.ipynb", "data"))
    # The example's images, made once for every test (each file written whole, so tests may share them).
    (ROOT / "examples" / "data").mkdir(exist_ok=True)
    (root / "examples" / "data").symlink_to(ROOT / "examples" / "data", target_is_directory=True)
    target = f"{root / 'examples' / 'image_classifier.py'}:train_step"
    runs = {}
    for name, knobs in (("plain", Knobs(num_workers=2)), ("bytes", Knobs(num_workers=2, uint8_copies=True))):
        result = run_trial(target, knobs, tmp_path / name, steps=3, wait=1, warmup=1, device="cpu")
        assert result.ok, result.message
        runs[name] = json.loads((tmp_path / name / "trial.json").read_text())
    assert runs["bytes"]["knob_outcomes"]["uint8_copies"] == APPLIED
    losses = {name: [s["loss"] for s in run["steps"]] for name, run in runs.items()}
    assert losses["bytes"] == losses["plain"] and len(losses["plain"]) >= 5
    plan = runs["bytes"]["uint8_plan"]
    assert plan["conversion"] == "np.asarray(image, dtype=np.float32) / 255.0"
    assert plan["normalization"] == "pixels = (pixels - 0.5) / 0.25" and plan["index"] == 0
    script = root / "examples" / "image_classifier.py"
    text = apply_bytes_patch(script, root, plan, runs["bytes"]["user_values"])
    assert "np.asarray(image, dtype=np.uint8)" in text and "(pixels - 0.5) / 0.25" not in text
    assert "(images.to(device).float() / 255 - 0.5) / 0.25" in text
    ran = run_script(script, "--epochs", "1", cwd=root, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert "loss" in ran.stdout
