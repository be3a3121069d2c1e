"""`uint8_copies`: the loader hands out 8-bit images; float and normalize where they are moved.

- **In the trial**: the training Dataset hands out the 8-bit image, its float conversion and normalization
  taken out:
    - a torchvision pipeline the Dataset holds (`FakeData(transform=...)`, `ImageFolder(root,
      transform=...)`, a custom Dataset's `self.transform`, through `Subset`s) becomes its transforms up to
      the conversion, unchanged, then `PILToTensor()` (v1 `ToTensor()`) or the 8-bit `ToImage()` output
      (v2 `ToDtype(torch.float32, scale=True)`), its `Normalize` out ([the pipelines](frameworks.md#torchvision-pipelines-timm-models-the-reference-scripts));
    - a hand-written `__getitem__` is read on a few of its items (the first, the middle, the last; the
      random state put back after each), whatever its spelling: the float image it returns is traced back
      to the statement that made it float and, within it, to the 8-bit source (an array, a tensor or a PIL
      image of as many values: `self.raw[i]`, a decoder's output, `Image.open(...)`); each step up from
      that source is a conversion (the values change: `np.float32(...)`, `.astype`, `/ 255`, `to_tensor`)
      or a layout (the same values moved: `transpose`, `.copy()`, `torch.from_numpy`, `torch.as_tensor`,
      `unsqueeze`). The function is compiled again with the conversions taken out (the layouts kept) and
      the later statements that change the image's values left out (a normalization however written: numpy
      or torch, constants as arrays, tuples, lists or literals, in place, a loop over channels, a
      `transforms.Normalize` object); run on the same items it must return an 8-bit image of the float
      one's shape, and a per-channel scale and offset (channels first or last) fitted over every item must
      give the float images back to float rounding, as `(x / 255 - mean) / std`;
    - the step's `.to(device)` of the batch converts and normalizes it right after the copy, with the same
      float32 operations (ToTensor's `/ 255`, v2's `* (1 / 255)`, Normalize's per-channel `sub` and `div` by
      float32 constants, the fitted constants in the dtype the Dataset computed in), so the same numbers
      reach the model: a quarter of the bytes to copy on a GPU. On the CPU the batch is converted as it
      leaves the loader, where it enters the step, whether or not the step moves it with `.to(...)`: the
      workers still hand over a quarter of the bytes (tests/test_pipeline_corpus.py: 20 spellings).
- **Proposed when**: host-to-device copies bind (the rule says how many MB and ms per step it saves), or the
  loader binds. 8-bit copies pay most with pinned memory: the pairing finds them.
- **Not applicable**:
    - a transform after the conversion but one `Normalize` (`RandomErasing` on the float tensor:
      "RandomErasing runs on the float image after ToTensor()");
    - `ToDtype(..., scale=False)` or another dtype, `ConvertImageDtype`, a `ToDtype` with no `ToImage()`
      before it;
    - a Dataset that holds several pipelines, or changes the transform's image before returning it;
    - a hand-written `__getitem__` whose float image is not its 8-bit source scaled and offset per channel
      on every probed item (a random jitter or noise on the float image, a clamp: "the closest fit misses by
      up to 0.037"), that makes it from no 8-bit image of as many values (images stored as floats), or whose
      8-bit form fails or returns another shape (the reason names it);
    - a transform that is not a torchvision pipeline.
- **The patch writes**: the 8-bit expression in the Dataset in place of the conversion, the statements the
  trial left out removed, and `(x.to(device).float() / 255 - mean) / std` where the step moves the batch
  (scalar constants; a module-level constant that holds the fitted values is written by its name); in a step
  that never moves its batch (the CPU), as the step's first statement, on the parameter it feeds the model
  (`images = normalized(images)`). For a torchvision pipeline, `ToTensor()` becomes
  `PILToTensor()` (v2: `ToDtype(torch.uint8, scale=True)`), its `Normalize(...)` leaves the `Compose([...])`.
  Per-channel constants are made once per device by a cached `normalization(device)` written beside the
  step, and the step reads `x = normalized(x.to(device))` (v2: `* (1 / 255)`; the script's own names for
  mean and std where its file holds them, else their values, in the dtype and layout the Dataset used). The
  pipeline is found by its transforms, in order, as one `Compose([...])` list in the file that builds the
  training loader, the script or the step's file; when none or several match, a note says what to change.
"""

from __future__ import annotations

from typing import Any

from advisor.knobs.graph import StepGraph, TrialSettings, faster_copies, undone
from advisor.knobs.knob import AT_DATASET, DATA, FLAG, FROM_TRIAL, Knob, WhatIf, Written
from advisor.knobs.offer import ROUND_GAIN, Best, Offer

UINT8_BYTES = 4.0  # a float32 image over its 8-bit one


def setting(trial: TrialSettings) -> bool:
    """Whether the trial's Dataset handed out 8-bit images."""
    return bool(trial.knobs.get("uint8_copies"))


def transform(g: StepGraph, value: Any, p: float, params: dict[str, float]) -> StepGraph:
    """The exposed copy time divided by UINT8_BYTES (a quarter of the bytes); with workers, the share u = p of
    their batch time spared too: the float conversion and three quarters of the bytes they pass back."""
    if bool(value) == g.uint8:
        return g
    produce = g.produce_s
    if g.workers > 0:
        produce *= (1 - p) if value else 1 + undone(p)
    return faster_copies(g, UINT8_BYTES, bool(value), produce_s=produce, uint8=bool(value),
                         batch_bytes=g.batch_bytes / UINT8_BYTES if value else g.batch_bytes * UINT8_BYTES)


# u: the share of a worker's batch time that converting to float and passing four times the bytes between
# processes took (none without workers; the copy itself moves a quarter of the bytes: `UINT8_BYTES`).
WHAT_IF = WhatIf("uint8_copies", "uint8", setting, transform, "uint8", prior=0.03, bounds=(-0.3, 0.5))


def offer(best: Best) -> Offer | None:
    """8-bit images from the loader, converted where the step moves them: a quarter of the bytes to copy where the
    copies bind (the rule's figure), and the conversion out of the workers wherever there are workers (the
    what-if model prices it; whatever the bound: a loader that no longer binds on its own still shares the cores
    with the step)."""
    advice = best.advice.get("fewer-copy-bytes")
    if best.knobs.uint8_copies or not best.space.allows("uint8_copies") or (
            advice is None and best.bound not in ("input", "copy") and best.workers <= 0):
        return None
    gain = advice.predicted_gain if advice is not None else ROUND_GAIN
    target = "copy" if advice is not None or best.bound == "copy" else "input"
    return Offer({"uint8_copies": True}, "8-bit images, converted on the device", "uint8-copies", gain, target,
                 predicted=advice is not None)


KNOB = Knob("uint8_copies", FLAG, DATA, AT_DATASET, "8-bit images", numerics=False, proposed_as="fewer-copy-bytes",
            spread=(0.10, 0.10), whatif=WHAT_IF, written=Written(FROM_TRIAL, record="uint8_plan"), offer=offer,
            idle=(False,),
            not_in_notebook="the notebook's loader and Dataset are its own: profile the script to measure 8-bit copies",
            on_data="advisor.trials.interposition.eight_bit_images:EightBitImages")
