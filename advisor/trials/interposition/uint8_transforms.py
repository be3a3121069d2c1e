"""The `uint8_copies` knob for torchvision pipelines: the training Dataset's transform hands out the 8-bit
image, and the step's `.to(device)` converts and normalizes it (`advisor.trials.interposition.eight_bit_images`).
Inside the trial only (torch and torchvision imported lazily, from the objects the script built).

The forms it moves, found on the Dataset's instance (the attribute its `__getitem__` calls, e.g.
`FakeData(transform=...)`, `ImageFolder(root, transform=...)`, a custom Dataset's `self.transform`; through
`Subset`s):

    v1: Compose([<PIL-level transforms>, ToTensor(), Normalize(mean, std)])            (Normalize optional)
    v2: Compose([<PIL- or 8-bit transforms>, ToImage(), <8-bit transforms>,
                 ToDtype(torch.float32, scale=True), Normalize(mean, std)])

mean and std scalar or per channel. The transforms before the conversion run unchanged (same objects, same
random draws); the conversion becomes `PILToTensor()` (v1) or stops at the 8-bit `ToImage()` output (v2, as
`ToDtype(torch.uint8, scale=True)` would leave it); the Normalize moves to the step. Anything after the
conversion but a Normalize (`RandomErasing` on the float tensor) would change the data: not applicable,
naming it. A sample that is not 8-bit after the transforms before the conversion (a 16-bit or float image)
goes through the user's own conversion instead, unchanged (its batch is not converted in the step).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

from advisor.trials.knobs import APPLIED, not_applicable
from advisor.trials.interposition.uint8_plan import BytePlan, returned_index

CONVERSIONS = ("ToTensor", "ToImage", "ToDtype", "PILToTensor", "ConvertImageDtype")


def _steps(transform: Any) -> list[Any] | None:
    """The transforms of a torchvision pipeline (a Compose, or one transform alone); None for anything else."""
    module = type(transform).__module__
    if not module.startswith("torchvision.transforms"):
        return None
    inner = getattr(transform, "transforms", None)
    return list(inner) if type(transform).__name__ == "Compose" and isinstance(inner, (list, tuple)) else [transform]


def _name(transform: Any) -> str:
    return type(transform).__name__


def _values(value: Any) -> float | list[float]:
    """Normalize's mean or std as the plan records it: a float, or one float per channel."""
    if isinstance(value, (int, float)):
        return float(value)
    values = [float(v) for v in value]
    return values[0] if len(values) == 1 else values


def _conversion(steps: list[Any]) -> tuple[int, str, bool] | str:
    """Where the float conversion is: (its index, its text, whether it multiplies by 1/255), or why not."""
    import torch

    for k, step in enumerate(steps):
        name = _name(step)
        if name == "ToTensor":
            return k, "ToTensor()", False
        if name == "ToDtype":
            dtype = getattr(step, "dtype", None)
            if dtype is not torch.float32 or not getattr(step, "scale", False):
                scale = getattr(step, "scale", None)
                return f"ToDtype({dtype}, scale={scale}) is not ToDtype(torch.float32, scale=True)"
            if not any(_name(s) in ("ToImage", "PILToTensor") for s in steps[:k]):
                return "ToDtype(torch.float32, scale=True) follows no ToImage()"
            return k, "ToDtype(torch.float32, scale=True)", True  # torchvision: image.to(float32).mul_(1 / 255)
        if name == "ConvertImageDtype":
            return ("ConvertImageDtype is not one of the conversions moved (ToTensor(), ToImage() + "
                    "ToDtype(torch.float32, scale=True))")
    return "the pipeline has no ToTensor() or ToDtype(torch.float32, scale=True)"


def wrapped_dataset(dataset: Any) -> Any:
    """The Dataset whose transform makes the samples, through torch's Subset wrappers."""
    from torch.utils.data import Subset

    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return dataset


def _image_index(cls: type, attribute: str) -> int | None | str:
    """Which element of what `cls.__getitem__` returns is the transform's output (None: alone), or why none.
    Read from the source: `x = self.<attribute>(...)` on the top level or under an `if`, then x untouched
    until it is returned; or `return self.<attribute>(...), ...` itself."""
    try:
        source = textwrap.dedent(inspect.getsource(cls.__getitem__))
    except (OSError, TypeError):
        return f"{cls.__name__}.__getitem__ has no Python source to read"
    function = ast.parse(source).body[0]
    if not isinstance(function, ast.FunctionDef):
        return f"{cls.__name__}.__getitem__ is not a plain function"

    def assigned(statement: ast.stmt) -> str | None:
        if isinstance(statement, ast.If) and len(statement.body) == 1 and not statement.orelse:
            statement = statement.body[0]
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Call) \
                and ast.unparse(statement.value.func) == f"self.{attribute}":
            return statement.targets[0].id
        return None

    def called(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and ast.unparse(node.func) == f"self.{attribute}"

    body = function.body
    for i, statement in enumerate(body):
        if isinstance(statement, ast.Return) and statement.value is not None:  # return self.transform(x), y
            value = statement.value
            elements = value.elts if isinstance(value, ast.Tuple) else None
            if called(value):
                return None
            if elements is not None and sum(map(called, elements)) == 1:
                return next(k for k, e in enumerate(elements) if called(e))
        name = assigned(statement)
        if name is None:
            continue
        for later in body[i + 1:]:
            if isinstance(later, ast.Return):
                index = returned_index(later, name)
                return f"{cls.__name__}.__getitem__ does not return self.{attribute}'s image as it is" \
                    if index is False else index
            if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(later)):
                return (f"{cls.__name__}.__getitem__ changes self.{attribute}'s image before returning it "
                        f"(`{ast.unparse(later).splitlines()[0]}`): moving the conversion would change the data")
        break
    return f"{cls.__name__}.__getitem__ does not call self.{attribute}(...) on its top level"


class EightBit:
    """The user's transforms before the conversion, then the 8-bit image (picklable, for the workers)."""

    def __init__(self, before: list[Any], rest: list[Any], version: str, plan: BytePlan):
        self.before, self.rest, self.plan = before, rest, plan
        self.version = version  # "pil": ToTensor's input (PIL or array) made 8-bit; "tensor": ToImage's output

    def __call__(self, image: Any) -> Any:
        import torch

        for step in self.before:
            image = step(image)
        if self.version == "tensor":
            out = image if isinstance(image, torch.Tensor) and image.dtype == torch.uint8 else None
        else:
            out = _pil_or_array_bytes(image)
        if out is not None:
            return out
        for step in self.rest:  # not 8-bit: the user's own conversion, unchanged
            image = step(image)
        return image


def _pil_or_array_bytes(image: Any) -> Any:
    """ToTensor()'s tensor before its division by 255, for the inputs where it divides (8-bit); else None."""
    import numpy as np
    import torch
    from torchvision.transforms import functional

    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3):
            return None
        array = image[:, :, None] if image.ndim == 2 else image
        return torch.from_numpy(np.ascontiguousarray(array.transpose((2, 0, 1))))
    try:
        out = functional.pil_to_tensor(image)
    except TypeError:
        return None
    return out if out.dtype == torch.uint8 and getattr(image, "mode", None) != "1" else None


def pipeline_plan_of(dataset: Any) -> BytePlan | None:
    """The plan of the 8-bit transform the trial put on this Dataset (or the one its Subset wraps), if any."""
    values = vars(wrapped_dataset(dataset)).values() if hasattr(wrapped_dataset(dataset), "__dict__") else ()
    return next((v.plan for v in values if isinstance(v, EightBit)), None)


def rewrite_pipeline(dataset: Any, site: str | None) -> tuple[BytePlan | None, str] | None:
    """For the trial: the training Dataset's torchvision transform hands out the 8-bit image (the attribute
    replaced on its instance). None when the Dataset holds no torchvision pipeline with a conversion (the
    hand-written forms are looked for instead); else the plan (None when not applicable) and the outcome."""
    holder = wrapped_dataset(dataset)
    found = [(k, _steps(v)) for k, v in vars(holder).items() if _steps(v) is not None] \
        if hasattr(holder, "__dict__") else []
    found = [(k, steps) for k, steps in found if any(_name(s) in CONVERSIONS for s in steps)]
    if not found:
        return None
    cls = type(holder)
    if len(found) > 1:
        names = ", ".join(f"self.{k}" for k, _ in found)
        return None, not_applicable(f"{cls.__name__} holds several transform pipelines ({names})")
    attribute, steps = found[0]
    conversion = _conversion(steps)
    if isinstance(conversion, str):
        return None, not_applicable(f"{cls.__name__}.{attribute}: {conversion}")
    k, text, multiply = conversion
    after = steps[k + 1:]
    others = [_name(s) for s in after if _name(s) != "Normalize"]
    if others or len(after) > 1:
        name = others[0] if others else "a second Normalize"
        return None, not_applicable(f"{cls.__name__}.{attribute}: {name} runs on the float image after {text}: "
                                    "moving the conversion would change the data")
    index = _image_index(cls, attribute)
    if isinstance(index, str):
        return None, not_applicable(index)
    normalize = after[0] if after else None
    mean = _values(normalize.mean) if normalize is not None else None
    std = _values(normalize.std) if normalize is not None else None
    file, _, line = (site or "").rpartition(":")
    plan = BytePlan(
        f"{cls.__module__}.{cls.__qualname__}", file or inspect.getsourcefile(cls) or "<unknown>",
        int(line) if line.isdigit() else 0, index, 255.0, mean, std, text,
        "ToDtype(torch.uint8, scale=True)" if multiply else "PILToTensor()",
        None if normalize is None else f"Normalize(mean={mean}, std={std})",
        kind="transform", multiply=multiply, transforms=tuple(_name(s) for s in steps), attribute=attribute)
    setattr(holder, attribute, EightBit(steps[:k], steps[k:], "tensor" if multiply else "pil", plan))
    if attribute == "transform" and type(getattr(holder, "transforms", None)).__name__ == "StandardTransform":
        holder.transforms.transform = getattr(holder, attribute)  # VisionDatasets that call self.transforms
    return plan, APPLIED
