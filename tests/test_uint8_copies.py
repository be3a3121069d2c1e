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
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from advisor.trials.interposition.eight_bit_images import ByteCopies, mark
from advisor.trials.interposition.uint8_plan import BytePlan
from advisor.trials.interposition.uint8_probe import probe_plan
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
    return load_module(tmp_path_factory.mktemp("ds"), "shapes_of_datasets", DATASETS)


def load_module(folder, name: str, source: str):
    """`source` imported as the module `name` from a file (inspect reads the Datasets' source there)."""
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, index, normalized", [("PilNormalized", 0, True), ("NumpyFloat32", None, False),
                                                     ("Astype", 1, False), ("TensorFloat", 0, True)])
def test_the_same_numbers_reach_the_step(datasets, name, index, normalized):
    cls = getattr(datasets, name)
    plan = probe_plan(cls())
    assert isinstance(plan, BytePlan), plan
    assert plan.index == index and (plan.mean is not None) == normalized and plan.scale == 255.0
    assert_same_numbers(cls(), plan)


def assert_same_numbers(dataset, plan: BytePlan) -> None:
    """The batches of `dataset` with its `__getitem__` rewritten by `plan`, converted by the step's `.to()`, are
    the numbers (and dtype) its own batches were, in float32 and bf16 alike."""
    cls, index = type(dataset), plan.index
    before = [b for b in DataLoader(dataset, batch_size=4)]
    original = cls.__getitem__
    cls.__getitem__ = plan.function
    try:
        after = [b for b in DataLoader(dataset, batch_size=4)]
    finally:
        cls.__getitem__ = original
    copies = ByteCopies(True)
    moved_to = copies.to(torch.Tensor.to)
    for old, new in zip(before, after):
        image_old = old if index is None else old[index]
        image_new = new if index is None else new[index]
        assert image_new.dtype == torch.uint8 and image_new.shape == image_old.shape
        mark(new, plan)
        got = moved_to(image_new, "cpu")  # the step's .to(device): the copy, then the conversion
        assert got.dtype == image_old.dtype and torch.equal(got, image_old)
        assert torch.equal(got.to(torch.bfloat16), image_old.to(torch.bfloat16))
        if index is not None:  # the rest of the batch is untouched
            assert all(torch.equal(a, b) for i, (a, b) in enumerate(zip(old, new)) if i != index)
    assert copies.converted == len(before)
    # A .to() that changes the dtype itself converts from the 8-bit image first: the numbers stay the same.
    mark(after[0], plan)
    image = after[0] if index is None else after[0][index]
    reference = before[0] if index is None else before[0][index]
    assert torch.equal(moved_to(image, torch.float64), reference.to(torch.float64))


CONSTANT_FORMS = '''
import numpy as np
import torch
from torch.utils.data import Dataset

PIXELS = np.random.default_rng(1).integers(0, 256, (8, 12, 10, 3), dtype=np.uint8)
MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
MEAN_LIST = [0.485, 0.456, 0.406]
STD_LIST = [0.229, 0.224, 0.225]
MEAN_TUPLE = (0.485, 0.456, 0.406)
STD_TUPLE = (0.229, 0.224, 0.225)
MEAN_T = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD_T = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class Eight(Dataset):
    def __len__(self):
        return 8


class TupleAssigned(Eight):  # the issue's: normalized channels-last, transposed to channels-first on return
    def __getitem__(self, i):
        img = np.float32(PIXELS[i]) / 255.0
        img = (img - MEAN) / STD
        return torch.from_numpy(img.transpose(2, 0, 1)), i % 3


class Lists(Eight):  # numpy computes with a list in float64
    def __getitem__(self, i):
        img = np.asarray(PIXELS[i], dtype=np.float32) / 255.0
        img = (img - MEAN_LIST) / STD_LIST
        img = img.transpose(2, 0, 1)
        return torch.from_numpy(img), i % 3


class Tuples(Eight):  # channels-last throughout
    def __getitem__(self, i):
        img = PIXELS[i].astype(np.float32) / 255
        img = (img - MEAN_TUPLE) / STD_TUPLE
        return torch.from_numpy(img)


class Inline(Eight):  # an array written in the statement, a scalar divisor
    def __getitem__(self, i):
        img = np.float32(PIXELS[i]) / 255.0
        img = torch.from_numpy(img).permute(2, 0, 1)
        img = (img - torch.tensor([0.5, 0.4, 0.3]).view(3, 1, 1)) / 0.25
        return img, i


class Tensors(Eight):  # normalized after the permute, by (3, 1, 1) tensors
    def __getitem__(self, i):
        x = torch.from_numpy(PIXELS[i]).permute(2, 0, 1).float() / 255
        x = (x - MEAN_T) / STD_T
        return x, i


class ClassAttributes(Eight):  # transposed first, then normalized by the class's (3, 1, 1) arrays
    MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)[:, None, None]
    STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)[:, None, None]

    def __getitem__(self, i):
        img = np.float32(PIXELS[i]) / 255.0
        img = img.transpose(2, 0, 1)
        img = (img - self.MEAN) / self.STD
        return torch.from_numpy(img), i


class InitAttributes(Eight):  # tensors __init__ made from its arguments; normalized channels-last
    def __init__(self, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
        self.mean = torch.tensor(mean)
        self.std = torch.tensor(std)

    def __getitem__(self, i):
        t = torch.from_numpy(PIXELS[i])
        x = t.float().div(255)
        x = (x - self.mean) / self.std
        x = x.permute(2, 0, 1).contiguous()
        return x, i
'''


@pytest.fixture(scope="module")
def constant_forms(tmp_path_factory):
    return load_module(tmp_path_factory.mktemp("forms"), "constant_forms", CONSTANT_FORMS)


@pytest.mark.parametrize("name, dtypes, codes, views", [
    ("TupleAssigned", ("float32", "float32"), ("MEAN", "STD"), ([3, 1, 1], [3, 1, 1])),
    ("Lists", ("float64", "float64"), ("MEAN_LIST", "STD_LIST"), ([3, 1, 1], [3, 1, 1])),
    ("Tuples", ("float64", "float64"), ("MEAN_TUPLE", "STD_TUPLE"), (None, None)),
    ("Inline", ("float32", "float32"), (None, None), (None, None)),  # no module constant holds them: values
    ("Tensors", ("float32", "float32"), ("MEAN_T", "STD_T"), (None, None)),
    # Read from the numbers, not the statement: a module-level constant holding the same values is named.
    ("ClassAttributes", ("float32", "float32"), ("MEAN", "STD"), ([3, 1, 1], [3, 1, 1])),
    ("InitAttributes", ("float32", "float32"), ("MEAN", "STD"), ([3, 1, 1], [3, 1, 1])),
])
def test_normalization_constants_in_the_forms_people_write_them(constant_forms, name, dtypes, codes, views):
    """Module constants (tuple-assigned, lists, tuples, np.array, torch.tensor), an inline tensor, class
    attributes and attributes __init__ set; normalized before or after the transpose to channels-first: the
    model gets the same numbers, and the plan says how the patch names each constant."""
    cls = getattr(constant_forms, name)
    dataset = cls()
    plan = probe_plan(dataset)
    assert isinstance(plan, BytePlan), plan
    assert (plan.dtypes, plan.codes, plan.views) == (dtypes, codes, views)
    assert_same_numbers(dataset, plan)


@pytest.mark.parametrize("name, reason", [
    ("Jittered", "is not the 8-bit one scaled and offset per channel: the closest fit"),
    ("Branch", "no statement on the function's top level makes the returned float image"),
])
def test_what_would_change_the_data_is_not_applicable(datasets, name, reason):
    plan = probe_plan(getattr(datasets, name)())
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
        result = run_trial(TrialSpec(target, knobs, tmp_path / name, steps=3, wait=1, warmup=1, device="cpu"))
        assert result.ok, result.message
        runs[name] = json.loads((tmp_path / name / "trial.json").read_text())
    assert runs["bytes"]["knob_outcomes"]["uint8_copies"] == APPLIED
    losses = {name: [s["loss"] for s in run["steps"]] for name, run in runs.items()}
    assert losses["bytes"] == losses["plain"] and len(losses["plain"]) >= 5
    plan = runs["bytes"]["uint8_plan"]
    assert plan["conversion"] == "np.asarray(image, dtype=np.float32) / 255.0"
    # Read from the running Dataset: the statement that changed the values is left out, its constants fitted.
    assert plan["removed"] == ["pixels = (pixels - 0.5) / 0.25"] and plan["index"] == 0
    assert (plan["mean"], plan["std"]) == (0.5, 0.25)
    script = root / "examples" / "image_classifier.py"
    text = apply_bytes_patch(script, root, plan, runs["bytes"]["user_values"])
    assert "np.array(image, dtype=np.uint8)" in text and "(pixels - 0.5) / 0.25" not in text
    assert "(images.to(device).float() / 255 - 0.5) / 0.25" in text
    ran = run_script(script, "--epochs", "1", cwd=root, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert "not writable" not in ran.stderr, ran.stderr  # the 8-bit array is the script's own copy, not PIL's buffer
    assert "loss" in ran.stdout
