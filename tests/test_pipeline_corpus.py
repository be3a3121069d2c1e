"""The `uint8_copies` knob on image pipelines as people write them: each file of tests/corpus/pipelines is one
spelling (the issue's convnet, albumentations-style numpy, OpenCV-style decoding, PIL to numpy, torch
throughout, a loop over channels, literal constants, MNIST-style grayscale, torchvision v1 and v2, timm's eval
transform, ...), written small, in our own words. The run-time check is run directly on each Dataset (no
profiled session per spelling): where it applies, the batches the step receives after the conversion are the
numbers the Dataset made itself (float32, and bf16 as autocast rounds them), converted where a GPU step's
`.to()` would and where the CPU's batch leaves the loader; where the 8-bit path would change the data, it is
refused with the reason and the number."""

from __future__ import annotations

import importlib.util
import re
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from advisor.trials.interposition.eight_bit_images import ByteCopies, mark, rewrite_dataset
from conftest import ROOT

CORPUS = ROOT / "tests" / "corpus" / "pipelines"
APPLIED = "applied"
NOT_AFFINE = "not the 8-bit one scaled and offset per channel"
# Each spelling: applied (how it was moved) or refused (the reason).
EXPECTED = {
    "issue_convnet": (APPLIED, "self.raw[i]"),
    "albumentations_normalize": (APPLIED, "image"),
    "cv2_style": (APPLIED, "img"),
    "pil_numpy_lists": (APPLIED, "np.array(img, dtype=np.uint8)"),
    "torch_as_tensor": (APPLIED, "torch.as_tensor(PIXELS[i]).permute(2, 0, 1)"),
    "torch_tensor_tuple": (APPLIED, "torch.as_tensor(PIXELS[i])"),
    "channel_loop": (APPLIED, "PIXELS[i]"),
    "literal_constants": (APPLIED, "PIXELS[i]"),
    "gan_minus_one": (APPLIED, "PIXELS[i]"),
    "mnist_grayscale": (APPLIED, "torch.from_numpy(DIGITS[i]).unsqueeze(0)"),
    "dict_sample": (APPLIED, "PIXELS[i]"),
    "random_crop_then_convert": (APPLIED, "img"),
    "normalize_object_on_tensor": (APPLIED, "torch.from_numpy(PIXELS[i]).permute(2, 0, 1)"),
    "to_tensor_functional": (APPLIED, "torch.as_tensor(np.array(img, dtype=np.uint8)).permute(2, 0, 1)"),
    "torchvision_compose": (APPLIED, "PILToTensor()"),
    "timm_eval_transform": (APPLIED, "PILToTensor()"),
    "torchvision_v2": (APPLIED, "ToDtype(torch.uint8, scale=True)"),
    "jitter_after_convert": ("refused", NOT_AFFINE),
    "clamp_after_noise": ("refused", NOT_AFFINE),
    "float_source": ("refused", "made from no 8-bit image"),
}


def spelling(name: str):
    """The corpus file `name` imported (inspect reads the Dataset's source from it)."""
    spec = importlib.util.spec_from_file_location(f"pipeline_corpus_{name}", CORPUS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def batches(dataset) -> list:
    """The Dataset's batches, from the same random state each time."""
    torch.manual_seed(0)
    np.random.seed(0)
    return list(DataLoader(dataset, batch_size=3))


def test_the_corpus_is_every_file_and_at_least_twenty_spellings():
    assert sorted(p.stem for p in CORPUS.glob("*.py")) == sorted(EXPECTED) and len(EXPECTED) >= 20


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_spelling_reaches_the_step_as_the_same_numbers_or_is_refused_with_the_reason(name):
    module = spelling(name)
    dataset = module.Images()
    before = batches(dataset)
    own = type(dataset).__getitem__
    try:
        plan, outcome = rewrite_dataset(dataset)
        after = batches(dataset) if plan is not None else []
    finally:
        type(dataset).__getitem__ = own
    expected, detail = EXPECTED[name]
    if expected != APPLIED:
        assert plan is None and outcome.startswith("not applicable") and detail in outcome
        if detail == NOT_AFFINE:  # the number that decided it, above what float rounding allows
            found = re.search(r"misses by up to (\S+) \(float rounding allows (\S+)\)", outcome)
            gap, allowed = map(float, found.groups())
            assert gap > 100 * allowed
        return
    assert outcome == APPLIED and plan.uint8 == detail
    copies = ByteCopies(True)
    moved_to = copies.to(torch.Tensor.to)
    for old, new in zip(before, after):
        image = new if plan.index is None else new[plan.index]
        reference = old if plan.index is None else old[plan.index]
        assert image.dtype == torch.uint8 and image.shape == reference.shape  # a quarter of the bytes
        mark(new, plan)
        on_device = moved_to(image, "cpu")  # a GPU step's .to(device): the copy, then the conversion
        at_loader = copies.at_loader(new, plan)  # the CPU: as the batch leaves the loader
        at_loader = at_loader if plan.index is None else at_loader[plan.index]
        for got in (on_device, at_loader):
            assert got.dtype == reference.dtype
            rounding = 8 * torch.finfo(reference.dtype).eps * max(1.0, float(reference.abs().max()))
            assert float((got - reference).abs().max()) <= rounding
            assert float((got.bfloat16().float() - reference.bfloat16().float()).abs().max()) <= 2 ** -7 * max(
                1.0, float(reference.abs().max()))  # at most one bf16 step apart where a value sits on a tie
        others = [(a, b) for i, (a, b) in enumerate(zip(old, new)) if i != plan.index] if plan.index is not None else []
        assert all(torch.equal(a, b) for a, b in others)  # the labels untouched
