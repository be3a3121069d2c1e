"""The `uint8_copies` knob: the DataLoader hands out 8-bit images, and the float conversion and the
normalization run where the step moves the batch to its device (right after the host-to-device copy on a
GPU: a quarter of the bytes; in the training process on the CPU: the workers' conversion moves out of
them). Inside the trial only (torch imported lazily).

Which Dataset code it changes is read from the source of the training Dataset's `__getitem__`, without
running it (`byte_plan`). It applies where the 8-bit image becomes float in one recognisable expression,
on the function's top level:

    np.asarray(img, dtype=np.float32) / 255.0      np.array(img, dtype="float32") / 255
    np.float32(img) / 255.0                        img.astype(np.float32) / 255.0
    t.float() / 255                                t.float().div(255)

possibly wrapped in layout-only calls (`torch.from_numpy(...)`, `.permute(2, 0, 1)`, `.contiguous()`),
then at most a normalization by constants (`x = (x - 0.5) / 0.25`), then returned (alone, or as one
element of the returned tuple). Anything else that touches the float tensor before it is returned (a
random jitter, a clamp), a conversion inside a branch: not applicable, with the reason; the data the model
sees never changes (torchvision pipelines the Dataset holds, `ToTensor()` + `Normalize`, are moved by
`advisor.trials.interposition.uint8_transforms`). The rewritten `__getitem__` returns the 8-bit tensor
(`np.asarray(img, dtype=np.uint8)`), the batch is marked as it leaves the loader (after pinning), and the
step's `.to(...)` of a marked batch returns it converted: `(x.float() / 255 - mean) / std`, the same float32
operations in the same order, so the same numbers reach the model.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

from advisor.trials.knobs import APPLIED, not_applicable
from advisor.trials.interposition.uint8_constants import constants, layout_ops, makes_tensor

MARK = "_advisor_uint8"  # the attribute a batch's 8-bit image tensor carries: its BytePlan
LAYOUT_CALLS = ("from_numpy", "as_tensor", "tensor", "permute", "contiguous", "transpose", "unsqueeze")


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
    uint8: str  # what it becomes, e.g. "np.asarray(image, dtype=np.uint8)"
    normalization: str | None  # the normalizing statement the rewrite removes, as written
    function: Any = None  # the rewritten __getitem__ (not recorded)
    # A torchvision pipeline (advisor.trials.interposition.uint8_transforms): kind "transform", the names of its transforms
    # in order, the Dataset's attribute that holds it; `multiply`: the conversion is x * (1 / 255) (v2's ToDtype).
    kind: str = "getitem"
    multiply: bool = False
    transforms: tuple[str, ...] = ()
    attribute: str | None = None
    # Of a hand-written normalization (advisor.trials.interposition.uint8_constants), mean's and std's: the dtype
    # the Dataset computed in (None: a number, in the image's), how module-level code names it, its shape there.
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


def _number(node: ast.AST) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    return None


def _is_float32(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return text in ("np.float32", "numpy.float32", "'float32'", "float32", "torch.float32", "torch.float")


def _uint8_of(node: ast.AST) -> tuple[ast.AST, float] | None:
    """For a conversion `<8-bit> -> float / 255`: the 8-bit expression to keep, and the divisor."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)) and not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "div"):
        return None
    left, right = (node.left, node.right) if isinstance(node, ast.BinOp) else (node.func.value, (node.args or [None])[0])
    scale = _number(right) if right is not None else None
    if scale != 255.0:
        return None
    if isinstance(left, ast.Call):
        func = ast.unparse(left.func)
        dtype = next((k.value for k in left.keywords if k.arg == "dtype"), None)
        if func in ("np.asarray", "np.array", "numpy.asarray", "numpy.array") and left.args and dtype is not None \
                and _is_float32(dtype):
            kept = ast.Call(left.func, [left.args[0]], [ast.keyword("dtype", ast.parse("np.uint8", mode="eval").body)])
            return kept, scale
        if func in ("np.float32", "numpy.float32") and len(left.args) == 1:
            return ast.Call(ast.parse("np.asarray", mode="eval").body, [left.args[0]],
                            [ast.keyword("dtype", ast.parse("np.uint8", mode="eval").body)]), scale
        if isinstance(left.func, ast.Attribute) and left.func.attr == "astype" and len(left.args) == 1 \
                and _is_float32(left.args[0]):
            return left.func.value, scale
        if isinstance(left.func, ast.Attribute) and left.func.attr == "float" and not left.args:
            return left.func.value, scale
        if isinstance(left.func, ast.Attribute) and left.func.attr == "to" and len(left.args) == 1 \
                and _is_float32(left.args[0]):
            return left.func.value, scale
    return None


class _Conversion(ast.NodeTransformer):
    """Replaces the one conversion inside layout-only calls with its 8-bit expression."""

    def __init__(self):
        self.found: tuple[ast.AST, ast.AST, float] | None = None  # (original, replacement, scale)
        self.other_calls: list[str] = []

    def visit(self, node: ast.AST) -> ast.AST:
        if self.found is None:
            hit = _uint8_of(node)
            if hit is not None:
                self.found = (node, hit[0], hit[1])
                return hit[0]
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else ast.unparse(node.func).split(".")[-1]
            if name not in LAYOUT_CALLS:
                self.other_calls.append(name)
        return self.generic_visit(node)


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _assigned(statement: ast.stmt, name: str) -> ast.AST | None:
    """The value of `name = <value>`."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
            and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id == name:
        return statement.value
    return None


def _normalization(statement: ast.stmt, name: str) -> tuple[ast.AST, ast.AST] | None:
    """`name = (name - A) / B`, A and B not reading `name`: (A, B), read as constants in the trial."""
    value = _assigned(statement, name)
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Div) and isinstance(value.left, ast.BinOp) \
            and isinstance(value.left.op, ast.Sub) and isinstance(value.left.left, ast.Name) \
            and value.left.left.id == name and name not in _names(value.left.right) | _names(value.right):
        return value.left.right, value.right
    return None


def byte_plan(cls: type, dataset: Any = None) -> BytePlan | str:
    """How `cls.__getitem__` can hand out 8-bit images, or why it cannot (one line); `dataset`, the instance,
    holds the constants `__init__` set."""
    function = getattr(cls, "__getitem__", None)
    try:
        source = textwrap.dedent(inspect.getsource(function))
        file = inspect.getsourcefile(function) or "<unknown>"
        first = inspect.getsourcelines(function)[1]
    except (OSError, TypeError):
        return f"{cls.__name__}.__getitem__ has no Python source to read"
    tree = ast.parse(source)
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        return f"{cls.__name__}.__getitem__ is not a plain function"
    if "super" in _names(node) or "__class__" in _names(node):
        return f"{cls.__name__}.__getitem__ calls super(): it cannot be rebuilt outside its class"
    body = list(node.body)
    for i, statement in enumerate(body):
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            continue
        finder = _Conversion()
        new_value = finder.visit(statement.value)
        if finder.found is None:
            continue
        original, replacement, scale = finder.found
        name = statement.targets[0].id
        line = first + statement.lineno - 1
        where = f"{cls.__name__}.__getitem__ (line {line})"
        if finder.other_calls:
            return f"{where}: the conversion is inside {finder.other_calls[0]}(...), which may change the numbers"
        left = original.left if isinstance(original, ast.BinOp) else original.func.value
        numpy_image = not (isinstance(left, ast.Call) and isinstance(left.func, ast.Attribute)
                           and left.func.attr in ("float", "to")) and not makes_tensor(statement.value)
        normalization, after, rest = None, [], []
        for later in body[i + 1:]:
            if isinstance(later, ast.Return):
                returned = returned_element(later, name)
                if returned is None:
                    return f"{where}: the float image is not what __getitem__ returns"
                index, ops = returned
                namespace = getattr(sys.modules.get(cls.__module__), "__dict__", {})  # the constants' module
                made = (None, None) if normalization is None else constants(
                    *normalization[:3], namespace, cls if dataset is None else dataset, after + ops)
                if isinstance(made, str):
                    return f"{where}: {made}"
                plan = BytePlan(f"{cls.__module__}.{cls.__qualname__}", file, line, index, scale,
                                *(None if c is None else c.values for c in made), ast.unparse(original),
                                ast.unparse(replacement), normalization and normalization[3],
                                dtypes=tuple(c and c.dtype for c in made), codes=tuple(c and c.code for c in made),
                                views=tuple(c and c.view for c in made))
                statement.value = new_value
                node.body = [*body[:i + 1], *rest, later]
                return _compiled(plan, tree, cls, file, first)
            if name not in _names(later):
                rest.append(later)
                continue
            value = _assigned(later, name)
            ops = None if value is None else layout_ops(value, name)
            if ops is not None:  # a layout change runs on the 8-bit image alike; the constants follow it
                rest.append(later)
                after += ops if normalization is not None else []
                numpy_image = numpy_image and not makes_tensor(later)
                continue
            found = _normalization(later, name) if normalization is None else None
            if found is None:
                text = ast.unparse(later).splitlines()[0]
                return (f"line {first + later.lineno - 1} changes the float image after the conversion "
                        f"(`{text}`): moving the conversion would change the data")
            normalization = (*found, numpy_image, ast.unparse(later))  # mean, std, on an ndarray, as written
        return f"{where}: no return follows the conversion on the function's top level"
    if "ToTensor" in source or "to_tensor" in source or "transform" in source:
        return (f"{cls.__name__}.__getitem__ converts through a transform that is not a torchvision pipeline held "
                "on the Dataset (ToTensor() or ToImage() + ToDtype(torch.float32, scale=True)): its 8-bit form is "
                "not known")
    return (f"{cls.__name__}.__getitem__ makes no float image in a way recognised without running it "
            "(np.asarray(img, dtype=np.float32) / 255.0, np.float32(img) / 255.0, t.float() / 255)")


def returned_index(statement: ast.Return, name: str) -> int | None | bool:
    """The returned tuple's element that is `name` (None: `name` alone), or False."""
    value = statement.value
    if isinstance(value, ast.Name) and value.id == name:
        return None
    if isinstance(value, ast.Tuple):
        hits = [i for i, e in enumerate(value.elts) if isinstance(e, ast.Name) and e.id == name]
        if len(hits) == 1 and not any(name in _names(e) for i, e in enumerate(value.elts) if i != hits[0]):
            return hits[0]
    return False


def returned_element(statement: ast.Return, name: str) -> tuple[int | None, list[tuple]] | None:
    """Which element of the returned value is `name` within layout-only calls (None: alone), and those calls;
    None when it is not returned so."""
    value = statement.value
    elements = value.elts if isinstance(value, ast.Tuple) else [value]
    found = [(i, layout_ops(e, name)) for i, e in enumerate(elements) if e is not None]
    hits = [(i, ops) for i, ops in found if ops is not None]
    if len(hits) != 1 or any(name in _names(e) for i, e in enumerate(elements) if i != hits[0][0]):
        return None
    return (hits[0][0] if isinstance(value, ast.Tuple) else None), hits[0][1]


def _compiled(plan: BytePlan, tree: ast.Module, cls: type, file: str, first: int) -> BytePlan:
    """The plan with the rewritten `__getitem__`, compiled in the Dataset's module (line numbers its own)."""
    tree = ast.fix_missing_locations(tree)
    ast.increment_lineno(tree, first - 1)
    namespace: dict[str, Any] = {}
    module = sys.modules.get(cls.__module__)
    exec(compile(tree, file, "exec"), module.__dict__ if module is not None else {}, namespace)  # noqa: S102
    return dataclasses.replace(plan, function=namespace[tree.body[0].name])


def rewrite_dataset(dataset: Any, site: str | None = None) -> tuple[BytePlan | None, str]:
    """For the trial: the training Dataset hands out 8-bit images (its torchvision transform or its class's
    `__getitem__` replaced; the process ends with the trial); returns the plan (None when not applicable)
    and the knob's outcome. `site`: where the DataLoader was built (the patch looks for the pipeline there)."""
    from advisor.trials.interposition.uint8_probe import probe_plan
    from advisor.trials.interposition.uint8_transforms import rewrite_pipeline

    if not hasattr(type(dataset), "__getitem__") or hasattr(dataset, "__iter__") and not hasattr(dataset, "__len__"):
        return None, not_applicable("the training DataLoader's dataset is not indexed by __getitem__")
    pipeline = rewrite_pipeline(dataset, site)
    if pipeline is not None:
        return pipeline
    plan = probe_plan(dataset)  # read from the Dataset's own items, whatever the spelling
    if isinstance(plan, str):
        return None, not_applicable(plan)
    type(dataset).__getitem__ = plan.function
    _REWRITTEN[type(dataset)] = plan
    return plan, APPLIED


_REWRITTEN: dict[type, BytePlan] = {}  # the Dataset classes whose __getitem__ this trial rebuilt


def plan_of(dataset: Any) -> BytePlan | None:
    """The plan that makes `dataset` hand out 8-bit images, if the trial applied one to it: the training
    loader's, or another loader's over the same Dataset (a validation loader, random_split's other Subset),
    whose batches are then converted where they are moved too."""
    from advisor.trials.interposition.uint8_transforms import pipeline_plan_of, wrapped_dataset

    found = pipeline_plan_of(dataset)
    if found is not None:
        return found
    return next((plan for cls, plan in _REWRITTEN.items() if isinstance(wrapped_dataset(dataset), cls)), None)


def mark(batch: Any, plan: BytePlan) -> None:
    """Tag the batch's 8-bit image tensor (as the step receives it, after pinning) with its plan."""
    import torch

    image = batch if plan.index is None else batch[plan.index] if isinstance(batch, (list, tuple)) else None
    if isinstance(image, torch.Tensor) and image.dtype == torch.uint8:
        setattr(image, MARK, plan)


class ByteCopies:
    """The step's `.to(...)` of a marked batch returns it converted to float and normalized."""

    def __init__(self, requested: bool):
        self.requested = requested
        self.converted = 0

    def to(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap `Tensor.to`: the copy first (8-bit bytes), then the conversion on its device."""
        interposition = self

        def to(tensor, *args, **kwargs):
            plan = getattr(tensor, MARK, None)
            if plan is None:
                return original(tensor, *args, **kwargs)
            interposition.converted += 1
            moved = original(tensor, *args, **kwargs)
            if moved.dtype == tensor.dtype:
                return plan.convert(moved)  # the 8-bit bytes were copied; the conversion runs where they went
            return original(plan.convert(tensor), *args, **kwargs)  # the call changes the dtype itself

        return to

    def at_loader(self, batch: Any, plan: BytePlan) -> Any:
        """The batch with its 8-bit image converted (on the CPU, as it leaves the loader for the step)."""
        import torch

        image = batch if plan.index is None else batch[plan.index] if isinstance(batch, (list, tuple)) else None
        if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8:
            return batch
        self.converted += 1
        if plan.index is None:
            return plan.convert(image)
        items = list(batch)
        items[plan.index] = plan.convert(image)
        return type(batch)(items) if isinstance(batch, tuple) and not hasattr(batch, "_fields") else items

    def outcome(self, loader_outcome: str | None) -> str | None:
        """The knob's outcome once the steps ran: the Dataset's (from the loader), or why the batch never
        reached the conversion."""
        if not self.requested:
            return None
        if loader_outcome is None:
            return not_applicable("no training DataLoader was built")
        if loader_outcome == APPLIED and not self.converted:
            return not_applicable("the step never moved the batch with .to(...), where the conversion runs")
        return loader_outcome
