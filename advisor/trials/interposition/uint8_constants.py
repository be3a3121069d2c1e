"""The normalization constants of a Dataset's `__getitem__` (`x = (x - MEAN) / STD`) for the `uint8_copies`
knob, read in the running trial in the forms people write them: numbers, module constants however assigned
(`MEAN, STD = ...`; lists, tuples, `np.array`, `torch.tensor`), class attributes and attributes set in
`__init__` (`self.mean`), indexed or reshaped (`MEAN[:, None, None]`, `.view(3, 1, 1)`). Each is recorded as
the step applies it after the copy: in the layout the batch has (a normalization before a `transpose` or
`permute` to channels-first follows it there), in the dtype the Dataset's own arithmetic computed (numpy makes
a list float64), and named as module-level code may name it (the patch uses the script's own names). Inside
the trial only (torch imported lazily)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

# The calls a constant's expression may make: building an array or tensor, or reshaping one.
CALLS = ("array", "asarray", "tensor", "as_tensor", "float32", "float64", "view", "reshape")
IDENTITY_CALLS = ("from_numpy", "as_tensor", "tensor", "contiguous", "ascontiguousarray")
TORCH_CALLS = ("from_numpy", "as_tensor", "tensor")  # the numpy image becomes a tensor


@dataclass(frozen=True)
class Constant:
    """One normalization constant as the step applies it."""

    values: float | list  # a number (applied as the Dataset applied its scalar), or nested lists in the batch's layout
    dtype: str | None  # the dtype the Dataset's operation computed in; None for a number (the image's own)
    code: str | None  # the expression module-level code reads it by; None: it is written as its values
    view: list[int] | None  # the shape it takes in the batch's layout, where that is not its own


def layout_ops(node: ast.AST, name: str) -> list[tuple] | None:
    """The layout-only calls around `name` in `node`, innermost first: ("permute", axes), ("swap", a, b) or
    ("same",); None when `node` is anything else."""
    if isinstance(node, ast.Name):
        return [] if node.id == name else None
    if not isinstance(node, ast.Call) or node.keywords:
        return None
    method = node.func.attr if isinstance(node.func, ast.Attribute) else None
    called = ast.unparse(node.func).split(".")[-1]
    on_self = isinstance(node.func, ast.Attribute) and not _is_module(node.func.value)
    inner, args = (node.func.value, node.args) if on_self else ((node.args or [None])[0], node.args[1:])
    if inner is None:
        return None
    ops = layout_ops(inner, name)
    kind = method if on_self else called
    if ops is None:
        return None
    if kind in IDENTITY_CALLS and not args:
        return [*ops, ("same",)]
    if kind in ("permute", "transpose"):
        axes = _ints(args)
        if axes is None:
            return None
        if kind == "transpose" and len(axes) == 2:
            return [*ops, ("swap", *axes)]
        return [*ops, ("permute", *axes)]
    return None


def _is_module(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("np", "numpy", "torch")


def _ints(args: list[ast.AST]) -> tuple[int, ...] | None:
    if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)):
        args = list(args[0].elts)
    try:
        values = tuple(ast.literal_eval(a) for a in args)
    except ValueError:
        return None
    return values if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values) else None


def makes_tensor(node: ast.AST) -> bool:
    """Whether the statement turns a numpy image into a tensor (`torch.from_numpy(...)`)."""
    return any(isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1] in TORCH_CALLS for n in ast.walk(node))


def read(node: ast.AST, namespace: dict, holder: Any) -> tuple[Any, str | None] | str:
    """The value of a constant's expression in the Dataset's module (`self` the Dataset, or its class without
    one) and how module-level code names it (None: only its values can); or why it is not a constant."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1] not in CALLS:
            return f"`{ast.unparse(node)}` calls {ast.unparse(n.func)}(), which may not be a constant"
        if isinstance(n, ast.Name) and n.id != "self" and n.id not in namespace and n.id not in ("np", "torch"):
            return f"`{ast.unparse(node)}` reads {n.id}, which is not a module-level name"
    try:
        value = eval(compile(ast.Expression(node), "<constant>", "eval"), namespace, {"self": holder})  # noqa: S307
    except Exception as exc:  # noqa: BLE001 - the user's expression: any failure means "not a constant"
        return f"`{ast.unparse(node)}` cannot be read as a constant ({type(exc).__name__}: {exc})"
    if callable(value) or isinstance(value, (bool, str, bytes)):
        return f"`{ast.unparse(node)}` is not a number, a sequence of numbers, an array or a tensor"
    return value, _module_code(node, holder)


def _module_code(node: ast.AST, holder: Any) -> str | None:
    """`MEAN` as written; `self.MEAN` as `Dataset.MEAN` where it is an attribute of a module-level class (not
    one `__init__` set); None otherwise."""
    if not any(isinstance(n, ast.Name) and n.id == "self" for n in ast.walk(node)):
        return ast.unparse(node)
    cls = holder if isinstance(holder, type) else type(holder)
    own = {} if isinstance(holder, type) else vars(holder)
    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)) or node.attr in own:
        return None
    owner = next((k for k in cls.__mro__ if node.attr in vars(k)), None)
    if owner is None or owner.__qualname__ != owner.__name__ or owner.__module__ != cls.__module__:
        return None
    return f"{owner.__name__}.{node.attr}"


def constants(mean: ast.AST, std: ast.AST, numpy_image: bool, namespace: dict, holder: Any,
              after: list[tuple]) -> tuple[Constant, Constant] | str:
    """The normalization's two constants as the step applies them to the batch; `numpy_image`: the Dataset
    normalized an ndarray (else a tensor); `after`: the layout calls between the normalization and the
    returned image."""
    import numpy as np
    import torch

    found = [read(node, namespace, holder) for node in (mean, std)]
    problem = next((f for f in found if isinstance(f, str)), None)
    if problem:
        return problem
    (mean_value, mean_code), (std_value, std_code) = found
    arrays = [_array(v) for v in (mean_value, std_value)]
    rank = max(a.ndim for a in arrays) or 1
    try:  # the dtypes the Dataset's own two operations computed in, on an image of ones
        image = np.ones((1,) * rank, np.float32) if numpy_image else torch.ones((1,) * rank)
        centred = image - mean_value
        dtypes = [_dtype_name(centred.dtype), _dtype_name((centred / std_value).dtype)]
    except Exception as exc:  # noqa: BLE001 - the user's constants: any failure means not applicable
        return f"the normalization's constants do not apply to a float image ({type(exc).__name__}: {exc})"
    made = []
    for array, code, dtype, before in zip(arrays, (mean_code, std_code), dtypes, ("float32", dtypes[0])):
        if array.ndim == 0 and dtype == before:  # a scalar in the image's dtype: applied as the Dataset did
            made.append(Constant(float(array), None, code, None))
            continue
        moved = _in_layout(array, after)
        if isinstance(moved, str):
            return moved
        view = None if moved.shape == array.shape else list(moved.shape)
        if view is not None and not np.array_equal(moved.ravel(), array.ravel()):
            code = None  # not a reshape of the script's constant: written as its values
        made.append(Constant(moved.astype(dtype).tolist(), dtype, code, view if code is not None else None))
    return made[0], made[1]


def _array(value: Any) -> Any:
    import numpy as np

    if hasattr(value, "detach"):  # a tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _in_layout(array: Any, ops: list[tuple]) -> Any:
    """The constant as it applies to the image after the layout calls `ops` (padded to the image's rank, as
    broadcasting aligns it); or why it cannot follow them."""
    for op in ops:
        if op[0] == "same":
            continue
        axes = op[1:] if op[0] == "permute" else None
        rank = len(axes) if axes is not None else max(array.ndim, 3, *(abs(a) + 1 for a in op[1:]))
        if array.ndim > rank:
            return f"a constant of {array.ndim} dimensions does not follow the image's {op[0]} of {rank}"
        array = array.reshape((1,) * (rank - array.ndim) + array.shape)
        array = array.transpose(axes) if axes is not None else array.swapaxes(op[1], op[2])
    return array
