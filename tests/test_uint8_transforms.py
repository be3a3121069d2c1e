"""The uint8_copies knob on torchvision pipelines: the Dataset's transform hands out the 8-bit image and the
step's `.to(...)` converts and normalizes it. Per pipeline form (v1 ToTensor + Normalize, v2 ToImage +
ToDtype + Normalize; per-channel and scalar constants; PIL augmentations before the conversion; FakeData,
ImageFolder, a custom Dataset, a Subset) the batches the step receives are the same float32 numbers as
without it; a float-level transform after the conversion makes it not applicable, naming it; the patch
writes it and the patched script prints the same losses; a real trial of a timm model on FakeData learns
exactly as without it, and a real session measures it."""

from __future__ import annotations

import importlib
import importlib.util
import json
import random
import re
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset, random_split

if importlib.util.find_spec("torchvision") is None:
    pytest.skip("needs torchvision", allow_module_level=True)


class Imported:
    """A torchvision module imported where a test first uses it: the test worker that collects this file but
    runs none of it is spared importing torchvision (2 s: it imports all its models)."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attribute: str):
        if attribute.startswith("_"):  # pytest's collection looks for markers and mocks: no reason to import
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self.name), attribute)


datasets, T, v2 = (Imported(f"torchvision.{name}") for name in ("datasets", "transforms", "transforms.v2"))

from advisor.trials.knobs import APPLIED, Knobs  # noqa: E402
from advisor.trials.launch.runner import run_trial  # noqa: E402
from advisor.trials.spec import TrialSpec  # noqa: E402
from advisor.trials.interposition.eight_bit_images import ByteCopies, mark, plan_of, rewrite_dataset  # noqa: E402
from conftest import ROOT, run_script  # noqa: E402
from trial_helpers import apply_bytes_patch  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # ImageNet's
MEAN32 = [float(v) for v in np.float32(MEAN)]  # as a float32 array or tensor holds them
SCRIPTS = ROOT / "tests" / "scripts"


def v1_augmented():
    return T.Compose([T.RandomResizedCrop(16, scale=(0.5, 1.0)), T.RandomHorizontalFlip(),
                      T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor(), T.Normalize(MEAN, STD)])


def v2_augmented():
    return v2.Compose([v2.RandomResizedCrop(16, scale=(0.5, 1.0)), v2.RandomHorizontalFlip(), v2.ToImage(),
                       v2.ColorJitter(0.4, 0.4, 0.4), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])


class Holding(Dataset):
    """A custom Dataset that holds its transform, as most scripts write one."""

    def __init__(self, transform=None):
        self.inner = datasets.FakeData(8, (3, 20, 20), 10)
        self.transform = transform

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        image, label = self.inner[i]
        if self.transform is not None:
            image = self.transform(image)
        return label, image


class Returning(Holding):
    def __getitem__(self, i):
        image, label = self.inner[i]
        return label, self.transform(image)


class Touching(Holding):
    def __getitem__(self, i):
        image, label = self.inner[i]
        image = self.transform(image)
        image = image.clamp(-2, 2)
        return image, label


class ClassConstants(Holding):
    """A Normalize built in `__init__` from the class's tuples."""

    MEAN = tuple(MEAN)
    STD = tuple(STD)

    def __init__(self):
        super().__init__(T.Compose([T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(self.MEAN, self.STD)]))


class InitConstants(Holding):
    """A Normalize built from arrays `__init__` set from its arguments."""

    def __init__(self, mean=MEAN, std=STD):
        self.mean, self.std = np.asarray(mean, np.float32), np.asarray(std, np.float32)
        super().__init__(v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                                     v2.Normalize(self.mean, self.std)]))


def fake(transform):
    return datasets.FakeData(8, (3, 20, 20), 10, transform=transform)


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    """A tiny ImageFolder: two classes of PNG and JPEG files (PIL's 8-bit RGB and L images)."""
    root = tmp_path_factory.mktemp("folder")
    for i, image in enumerate(datasets.FakeData(8, (3, 20, 20), 2)):
        picture, label = image
        (root / str(label)).mkdir(exist_ok=True)
        (picture.convert("L") if i % 3 == 0 else picture).save(root / str(label) / f"{i}.{'png' if i % 2 else 'jpg'}")
    return root


FORMS = {  # name: (Dataset, the image's index in a sample, conversion, mean)
    "v1 ImageNet, PIL augmentations": (lambda _: fake(v1_augmented()), 0, "ToTensor()", MEAN),
    "v1 scalar": (lambda _: fake(T.Compose([T.ToTensor(), T.Normalize(0.5, 0.25)])), 0, "ToTensor()", 0.5),
    "v1 ToTensor alone": (lambda _: fake(T.ToTensor()), 0, "ToTensor()", None),
    "v2 ImageNet, augmentations": (lambda _: fake(v2_augmented()), 0, "ToDtype(torch.float32, scale=True)", MEAN),
    "v2 scalar": (lambda _: fake(v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                                             v2.Normalize([0.5], [0.5])])), 0, "ToDtype(torch.float32, scale=True)",
                  0.5),
    "ImageFolder": (lambda root: datasets.ImageFolder(root, transform=T.Compose(
        [T.Resize((16, 16)), T.Grayscale(3), T.ToTensor(), T.Normalize(MEAN, STD)])), 0, "ToTensor()", MEAN),
    "custom Dataset": (lambda _: Holding(v1_augmented()), 1, "ToTensor()", MEAN),
    "custom Dataset returning the transform's call": (lambda _: Returning(v2_augmented()), 1,
                                                      "ToDtype(torch.float32, scale=True)", MEAN),
    "v1 np.array constants": (lambda _: fake(T.Compose([T.ToTensor(), T.Normalize(
        np.array(MEAN, np.float32), np.array(STD, np.float32))])), 0, "ToTensor()", MEAN32),
    "v2 torch.tensor constants": (lambda _: fake(v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                                                             v2.Normalize(torch.tensor(MEAN), torch.tensor(STD))])),
                                  0, "ToDtype(torch.float32, scale=True)", MEAN32),
    "class attributes (tuples)": (lambda _: ClassConstants(), 1, "ToTensor()", MEAN),
    "attributes __init__ set (arrays)": (lambda _: InitConstants(), 1, "ToDtype(torch.float32, scale=True)", MEAN32),
    "Subset": (lambda _: Subset(fake(v2_augmented()), [5, 1, 6, 2, 0, 3, 7, 4]), 0,
               "ToDtype(torch.float32, scale=True)", MEAN),
}


def batches(dataset, plan=None):
    torch.manual_seed(0)  # the augmentations draw the same numbers in both passes
    random.seed(0)
    out = []
    for batch in DataLoader(dataset, batch_size=4):
        if plan is not None:
            mark(batch, plan)
        out.append(batch)
    return out


@pytest.mark.parametrize("form", list(FORMS))
def test_each_pipeline_hands_the_model_the_same_numbers(form, image_folder):
    make, index, conversion, mean = FORMS[form]
    before = batches(make(image_folder))
    dataset = make(image_folder)
    plan, outcome = rewrite_dataset(dataset, "/somewhere/train.py:12")
    assert outcome == APPLIED and plan is not None
    assert (plan.kind, plan.index, plan.conversion, plan.mean) == ("transform", index, conversion, mean)
    assert plan.multiply == conversion.startswith("ToDtype") and (plan.file, plan.line) == ("/somewhere/train.py", 12)
    after = batches(dataset, plan)
    copies = ByteCopies(True)
    moved_to = copies.to(torch.Tensor.to)
    for old, new in zip(before, after, strict=True):
        assert new[index].dtype == torch.uint8 and new[index].shape == old[index].shape
        got = moved_to(new[index], "cpu")  # the step's .to(device): the copy, then the conversion
        assert got.dtype == torch.float32 and torch.equal(got, old[index])
        assert torch.equal(got.to(torch.bfloat16), old[index].to(torch.bfloat16))
        assert torch.equal(new[1 - index], old[1 - index])  # the labels untouched
    assert copies.converted == len(before) == 2


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("form", list(FORMS))
def test_after_a_real_copy_to_the_gpu_the_numbers_are_the_same(form, image_folder):
    """On a GPU the conversion runs after the copy, on the device: bit for bit the Dataset's float32 numbers
    (divisors and Normalize's constants on the device, as torchvision's own Normalize puts them)."""
    make, index, _, _ = FORMS[form]
    before = batches(make(image_folder))
    dataset = make(image_folder)
    plan, outcome = rewrite_dataset(dataset)
    assert outcome == APPLIED
    moved_to = ByteCopies(True).to(torch.Tensor.to)
    for old, new in zip(before, batches(dataset, plan), strict=True):
        got = moved_to(new[index], "cuda", non_blocking=True)
        assert got.device.type == "cuda" and torch.equal(got.cpu(), old[index])


def test_a_loader_over_the_same_dataset_gets_its_batches_converted_too():
    """random_split's Subsets share one Dataset: the validation loader's batches are 8-bit as well once the
    training one's transform is, so they are marked and converted where they are moved, to the same numbers."""
    full = fake(v1_augmented())
    train, val = random_split(full, [4, 4], generator=torch.Generator().manual_seed(0))
    before = batches(val)
    plan, outcome = rewrite_dataset(train)
    assert outcome == APPLIED and plan_of(val) is plan and plan_of(fake(v1_augmented())) is None
    after = batches(val, plan_of(val))
    moved_to = ByteCopies(True).to(torch.Tensor.to)
    assert after[0][0].dtype == torch.uint8 and torch.equal(moved_to(after[0][0], "cpu"), before[0][0])


def test_the_v2_conversion_is_a_multiply_as_torchvision_makes_it():
    """v2's ToDtype multiplies by 1/255 where ToTensor divides by 255: the two differ in the last bit for
    some pixels, so a plan that divided would not hand the model v2's numbers."""
    pixels = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16)
    divided, multiplied = pixels.float() / 255, pixels.float().mul_(1.0 / 255)
    assert not torch.equal(divided, multiplied)
    assert torch.equal(multiplied, v2.ToDtype(torch.float32, scale=True)(pixels))
    assert torch.equal(divided, T.ConvertImageDtype(torch.float32)(pixels))


@pytest.mark.parametrize("dataset, reason", [
    (lambda: fake(T.Compose([T.ToTensor(), T.RandomErasing(), T.Normalize(MEAN, STD)])),
     "FakeData.transform: RandomErasing runs on the float image after ToTensor(): moving the conversion would "
     "change the data"),
    (lambda: fake(v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD),
                              v2.RandomErasing()])),
     "RandomErasing runs on the float image after ToDtype(torch.float32, scale=True)"),
    (lambda: fake(v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32)])),
     "ToDtype(torch.float32, scale=False) is not ToDtype(torch.float32, scale=True)"),
    (lambda: Touching(T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])),
     "Touching.__getitem__ changes self.transform's image before returning it (`image = image.clamp(-2, 2)`)"),
])
def test_float_level_transforms_are_not_applicable(dataset, reason):
    data = dataset()
    transform = data.transform
    plan, outcome = rewrite_dataset(data)
    assert plan is None and reason in outcome and outcome.startswith("not applicable")
    assert data.transform is transform  # the data the model sees never changes


V2_SCRIPT = '''
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets
from torchvision.transforms import v2

MEAN = (0.485, 0.456, 0.406)


def train_step(model, images, labels, optimizer):
    images = images.to("cpu")
    optimizer.zero_grad()
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


if __name__ == "__main__":
    torch.manual_seed(0)
    pipeline = v2.Compose([
        v2.RandomResizedCrop(16, scale=(0.5, 1.0)),
        v2.ToImage(),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=MEAN, std=[0.229, 0.224, 0.225]),
    ])
    loader = DataLoader(datasets.FakeData(24, (3, 20, 20), 4, transform=pipeline), batch_size=8, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for images, labels in loader:
        print(f"loss {train_step(model, images, labels, optimizer)!r}")
'''

V1_NAMED_SCRIPT = V2_SCRIPT.replace("from torchvision.transforms import v2",
                                    "from torchvision.transforms import Compose, Normalize, RandomResizedCrop, ToTensor"
                                    ).replace('''    pipeline = v2.Compose([
        v2.RandomResizedCrop(16, scale=(0.5, 1.0)),
        v2.ToImage(),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=MEAN, std=[0.229, 0.224, 0.225]),
    ])''', '''    pipeline = Compose([RandomResizedCrop(16, scale=(0.5, 1.0)), ToTensor(), Normalize(0.5, 0.25)])''')


def losses(script: Path) -> list[str]:
    ran = run_script(script, cwd=script.parent, timeout=300)
    assert ran.returncode == 0, ran.stderr
    return re.findall(r"loss (\S+)", ran.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("source, changed, step, compared", [
    (V2_SCRIPT, "v2.ToDtype(torch.uint8, scale=True),",
     'images = normalized(images.to("cpu"))', True),
    (V1_NAMED_SCRIPT, "pipeline = Compose([RandomResizedCrop(16, scale=(0.5, 1.0)), PILToTensor()])",
     'images = (images.to("cpu").float() / 255 - 0.5) / 0.25', False),
], ids=["v2", "v1 imported by name"])
def test_the_patch_writes_the_pipeline_and_the_step_and_the_script_learns_the_same(tmp_path, source, changed, step,
                                                                                    compared):
    """The plan the trial records for the script's pipeline, written into the script: the patched script
    runs, and prints the same losses, step by step, as the original (`compared`: one form is enough to pay
    for the original's run)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    namespace = {"__name__": "pipeline_only"}
    exec(compile(script.read_text().split('if __name__ == "__main__":')[0], str(script), "exec"), namespace)
    pipeline = eval(re.search(r"pipeline = (.*?\]\))\n", source, re.S).group(1), namespace)  # noqa: S307
    plan, outcome = rewrite_dataset(datasets.FakeData(24, (3, 20, 20), 4, transform=pipeline), f"{script}:27")
    assert outcome == APPLIED
    original = losses(script) if compared else None
    text = apply_bytes_patch(script, tmp_path, plan.to_dict())
    assert changed in text and step in text and "Normalize(" not in text.split("if __name__")[1]
    patched = losses(script)
    assert len(patched) == 3 and (patched == original or not compared)
    if source is V1_NAMED_SCRIPT:
        assert "from torchvision.transforms import PILToTensor" in text  # imported by name, as ToTensor was


@pytest.fixture(scope="module")
def timm_trials(tmp_path_factory):
    """The timm model on FakeData (ToTensor + ImageNet's Normalize) in two real trials, with and without
    8-bit copies, two workers each."""
    pytest.importorskip("timm")
    folder = tmp_path_factory.mktemp("timm")
    shutil.copy(SCRIPTS / "timm_fakedata.py", folder / "timm_fakedata.py")
    runs = {}
    for name, knobs in (("plain", Knobs(num_workers=2)), ("bytes", Knobs(num_workers=2, uint8_copies=True))):
        result = run_trial(TrialSpec(f"{folder / 'timm_fakedata.py'}:train_step", knobs, folder / name, steps=3, wait=1,
                                     warmup=1, device="cpu"))
        assert result.ok, result.message
        runs[name] = json.loads((folder / name / "trial.json").read_text())
    return folder, runs


@pytest.mark.slow
def test_a_timm_trial_learns_exactly_as_without_the_knob_and_its_patch_runs(timm_trials):
    """The trial set measures the knob (each trial's samples/s) and the model learns exactly as without it."""
    folder, runs = timm_trials
    assert runs["bytes"]["knob_outcomes"]["uint8_copies"] == APPLIED
    assert all(run["summary"]["samples_per_s"] > 0 and run["summary"]["steps_recorded"] == 3 for run in runs.values())
    recorded = {name: [s["loss"] for s in run["steps"]] for name, run in runs.items()}
    assert recorded["bytes"] == recorded["plain"] and len(recorded["plain"]) >= 5
    plan = runs["bytes"]["uint8_plan"]
    assert plan["transforms"] == ["RandomResizedCrop", "RandomHorizontalFlip", "ColorJitter", "ToTensor", "Normalize"]
    assert (plan["mean"], plan["std"], plan["index"]) == (MEAN, STD, 0)
    script = folder / "timm_fakedata.py"
    text = apply_bytes_patch(script, folder, plan, runs["bytes"]["user_values"])
    assert "transforms.PILToTensor()," in text and "transforms.Normalize(" not in text
    # The constants made once per device, by the script's own names; the step's line short.
    assert "images = normalized(images.to(device))" in text and "@functools.cache\ndef normalization(device):" in text
    assert "mean = torch.as_tensor(IMAGENET_MEAN, dtype=torch.float32, device=device)" in text
    patched = run_script(script, "--steps", "3", cwd=folder, timeout=300)
    assert patched.returncode == 0, patched.stderr
    assert patched.stdout.count("loss") == 3
