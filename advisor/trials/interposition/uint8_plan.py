"""What the `uint8_copies` knob does to one Dataset (`BytePlan`): how its `__getitem__` (or its torchvision
pipeline) is rewritten to hand out 8-bit images, and how a batch is converted back to the float tensor the
Dataset made. Read by the probe (`uint8_probe`) and the pipeline's rewrite (`uint8_transforms`), applied by
`uint8_copies`; torch imported lazily.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BytePlan:
    """How one Dataset's `__getitem__` is rewritten and its batches converted back."""

    cls: str  # the Dataset class, qualified
    file: str
    line: int  # of the conversion, in the user's file
    index: int | None  # the returned tuple's element that holds the image (None: the image alone)
    scale: float  # the conversion's divisor (255)
    mean: float | list | None  # normalization constants, when the Dataset normalizes (lists: in the batch's layout)
    std: float | list | None
    conversion: str  # the float conversion as the user wrote it, e.g. "np.asarray(image, dtype=np.float32) / 255.0"
    uint8: str  # what it becomes, e.g. "np.array(image, dtype=np.uint8)"
    normalization: str | None  # the normalizing statement the rewrite removes, as written
    function: Any = None  # the rewritten __getitem__ (not recorded)
    # A torchvision pipeline (`uint8_transforms`): kind "transform", the names of its transforms in order, the
    # Dataset's attribute that holds it; `multiply`: the conversion is x * (1 / 255) (v2's ToDtype).
    kind: str = "getitem"
    multiply: bool = False
    transforms: tuple[str, ...] = ()
    attribute: str | None = None
    # Of a hand-written normalization (advisor.trials.interposition.uint8_probe), mean's and std's: the dtype
    # the Dataset computed in (None: a number, in the image's), the module-level name that holds them, its shape.
    dtypes: tuple[str | None, str | None] = (None, None)
    codes: tuple[str | None, str | None] = (None, None)
    views: tuple[list[int] | None, list[int] | None] = (None, None)
    # Read on the running Dataset (advisor.trials.interposition.uint8_probe): the statements left out, as written.
    removed: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """What the trial records (the patch writes the same change)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in
                ((k, getattr(self, k)) for k in ("cls", "file", "line", "index", "scale", "mean", "std", "conversion",
                                                 "uint8", "normalization", "kind", "multiply", "transforms",
                                                 "attribute", "dtypes", "codes", "views", "removed"))}

    def convert(self, tensor: Any) -> Any:
        """The float tensor the Dataset made, from its 8-bit one (same float32 operations, same order)."""
        x = tensor.float()
        if self.multiply:
            x = x.mul_(1.0 / self.scale)  # torchvision v2's ToDtype(torch.float32, scale=True)
        else:
            # Divisors on the tensor's device: CUDA divides by a host scalar as a multiply by its reciprocal,
            # which can differ from the Dataset's division in the last bit.
            x = x / _constant(self.scale, x)
        if self.mean is None:
            return x
        if self.kind == "transform":  # as torchvision's Normalize: constants as float32 tensors, per channel
            return x.sub_(_constant(self.mean, x)).div_(_constant(self.std, x))
        centred = x - self._applied(0, x)
        return centred / self._applied(1, centred)

    def _applied(self, k: int, like: Any) -> Any:
        """mean (k=0) or std as the Dataset applied it to `like`: a number as numpy and torch apply a float
        (the divisor as a tensor, see above), else a tensor in the dtype the Dataset computed in."""
        value, dtype = (self.mean, self.std)[k], self.dtypes[k]
        if dtype is None:
            return value if k == 0 else _constant(value, like)
        return _constant(value, like, dtype, shaped=False)


_CONSTANTS: dict[tuple, Any] = {}  # the constants on each device, made once (not a copy per batch)


def _constant(values: float | list, like: Any, dtype: str | None = None, shaped: bool = True) -> Any:
    """`values` as torchvision's Normalize makes them: a tensor of `like`'s dtype on its device, (C, 1, 1) per
    channel; or (`shaped` False) in `dtype`, in the shape `values` has (the batch's layout)."""
    import torch

    key = (repr(values), str(like.device), dtype or like.dtype, shaped)
    if key not in _CONSTANTS:
        tensor = torch.as_tensor(values, dtype=getattr(torch, dtype) if dtype else like.dtype, device=like.device)
        _CONSTANTS[key] = tensor.view(-1, 1, 1) if tensor.ndim == 1 and shaped else tensor
    return _CONSTANTS[key]


def returned_index(statement: ast.Return, name: str) -> int | None | bool:
    """The returned tuple's element that is `name` (None: `name` alone), or False."""
    value = statement.value
    if isinstance(value, ast.Name) and value.id == name:
        return None
    if isinstance(value, ast.Tuple):
        hits = [i for i, e in enumerate(value.elts) if isinstance(e, ast.Name) and e.id == name]
        if len(hits) == 1 and not any(isinstance(n, ast.Name) and n.id == name
                                      for i, e in enumerate(value.elts) if i != hits[0] for n in ast.walk(e)):
            return hits[0]
    return False
