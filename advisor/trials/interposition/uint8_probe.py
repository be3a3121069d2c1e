"""The `uint8_copies` knob's evidence for a hand-written `__getitem__`: what the Dataset's float image is, read
from a few of its items, however it is spelled. Inside the trial only (torch and numpy imported lazily).

The `__getitem__` runs on a few items with every value its statements compute recorded (the random state put
back after each). The float image it returns is traced back to the statement that made it float, and within
it to the 8-bit source (an array, a tensor or a PIL image of as many values: `self.raw[i]`, `cv2.imread(...)`,
`Image.open(...)`); each step up from that source is read as a conversion (the values change) or a layout
(the same values, moved: a transpose, `.copy()`, `torch.from_numpy`, `torch.as_tensor`). The function is
compiled again with the conversion replaced by the 8-bit source and the later statements that change the
image's values (a normalization, a loop over channels, `transforms.Normalize`) left out; run on the same
items with the same random state, it must return an 8-bit image of the float one's shape, and the float one
must be the 8-bit one scaled and offset per channel (the channel read as the first or the last axis) to
float rounding on every item: `(x / 255 - mean) / std`, the numbers the step's conversion computes.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import textwrap
from typing import Any

from advisor.trials.interposition.uint8_plan import BytePlan

RECORD = "__advisor_value__"
AFTER = "__advisor_locals__"
PROBED = 3  # items read: the first, the middle and the last


class Recorded(ast.NodeTransformer):
    """Every loaded expression of the top-level statements wrapped in a call that records its value."""

    def __init__(self) -> None:
        self.nodes: dict[int, ast.AST] = {}

    def visit_Call(self, node: ast.Call) -> ast.AST:
        node.args = [self.visit(a) for a in node.args]
        node.keywords = [self.visit(k) for k in node.keywords]
        if isinstance(node.func, ast.Attribute):  # the receiver, not the bound method
            node.func.value = self.visit(node.func.value)
        return self.wrap(node)

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        return node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        if isinstance(node, (ast.Name, ast.Subscript, ast.Attribute, ast.BinOp)) and \
                isinstance(getattr(node, "ctx", ast.Load()), ast.Load):
            return self.wrap(node)
        return node

    def wrap(self, node: ast.AST) -> ast.AST:
        self.nodes[id(node)] = node
        return ast.Call(ast.Name(RECORD, ast.Load()), [ast.Constant(id(node)), node], [])


def as_array(value: Any) -> Any:
    """A copy of an image-like value as a numpy array (None for anything else)."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy() if value.dtype != torch.bfloat16 else None
    if isinstance(value, np.ndarray):
        return value.copy()
    if type(value).__module__.startswith("PIL.") and hasattr(value, "mode"):
        return np.asarray(value).copy()
    return None


def kind(array: Any) -> str | None:
    """"8-bit" or "float" for an image-like array, else None."""
    if array is None or array.ndim < 2:
        return None
    return "8-bit" if str(array.dtype) == "uint8" else "float" if array.dtype.kind == "f" else None


def same_values(a: Any, b: Any) -> bool:
    """The same numbers, however laid out (a layout step), in the same kind of dtype."""
    import numpy as np

    return a.size == b.size and kind(a) == kind(b) and np.array_equal(np.sort(a, axis=None), np.sort(b, axis=None))


def random_state() -> tuple:
    import random

    import numpy as np
    import torch

    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def set_random_state(state: tuple) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.set_rng_state(state[2])


def returned_image(value: Any) -> tuple[int | None, Any] | None:
    """(the element of the returned value that is the float image (None: alone), it as an array)."""
    elements = list(value) if isinstance(value, (tuple, list)) else [value]
    found = [(i, as_array(e)) for i, e in enumerate(elements)]
    images = [(i, a) for i, a in found if kind(a) == "float"]
    if not images:
        return None
    i, array = max(images, key=lambda pair: pair[1].size)
    return (i if isinstance(value, (tuple, list)) else None), array


def probe_plan(dataset: Any) -> BytePlan | str:
    """How the Dataset's own `__getitem__` hands out its 8-bit image, read and checked on a few items; or why
    not (one line, with the number that decided it)."""
    cls = type(dataset)
    function = getattr(cls, "__getitem__", None)
    try:
        source = textwrap.dedent(inspect.getsource(function))
        file = inspect.getsourcefile(function) or "<unknown>"
        first = inspect.getsourcelines(function)[1]
    except (OSError, TypeError):
        return f"{cls.__name__}.__getitem__ has no Python source to read"
    original = ast.parse(source).body[0]
    node = ast.parse(ast.unparse(original)).body[0]  # as ast writes it: the instrumented copy has its positions
    if not isinstance(node, ast.FunctionDef) or any(isinstance(n, ast.Name) and n.id in ("super", "__class__")
                                                    for n in ast.walk(node)):
        return f"{cls.__name__}.__getitem__ is not a plain function of its own (a decorator, super())"
    module = sys.modules.get(cls.__module__)
    namespace = module.__dict__ if module is not None else {}
    length = len(dataset) if hasattr(dataset, "__len__") else 1
    items = sorted({0, length // 2, max(0, length - 1)})[:PROBED]
    saved = random_state()
    try:
        runs = [record_item(dataset, node, namespace, file, first, i) for i in items]
    except Exception as exc:  # noqa: BLE001 - the user's __getitem__, instrumented
        return f"{cls.__name__}.__getitem__ failed when probed ({type(exc).__name__}: {exc})"
    finally:
        set_random_state(saved)
    found = trace_back(node, runs[0])
    if isinstance(found, str):
        return f"{cls.__name__}.__getitem__: {found}"
    found["line"] = first + original.body[node.body.index(found["statement"])].lineno - 1
    return fitted_plan(dataset, node, namespace, file, first, runs, found, saved)


def record_item(dataset: Any, node: ast.FunctionDef, namespace: dict, file: str, first: int, item: int) -> dict:
    """One item through the instrumented `__getitem__`: every value recorded, the locals after each top-level
    statement, what it returned; the random state it started from."""
    values: dict[int, Any] = {}
    pil: set[int] = set()  # the values that were PIL images (their 8-bit form is np.asarray of them)
    tensors: set[int] = set()  # the values that were tensors
    after: dict[int, dict[str, Any]] = {}
    recorder = Recorded()
    function = recorder.visit(ast.parse(ast.unparse(node)).body[0])
    body = []
    for k, statement in enumerate(function.body):
        body.append(statement)
        if not isinstance(statement, ast.Return):
            body.append(ast.parse(f"{AFTER}({k}, locals())").body[0])
    function.body = body
    code = compile(ast.fix_missing_locations(ast.Module([function], [])), file, "exec")

    def record(key: int, value: Any) -> Any:
        array = as_array(value)
        if kind(array) is not None:
            values[key] = array
            if type(value).__module__.startswith("PIL."):
                pil.add(key)
            if type(value).__module__.startswith("torch"):
                tensors.add(key)
        return value

    def snapshot(k: int, local: dict) -> None:
        after[k] = {name: as_array(v) for name, v in local.items() if kind(as_array(v)) is not None}

    scope: dict[str, Any] = {}
    exec(code, {**namespace, RECORD: record, AFTER: snapshot}, scope)  # noqa: S102 - the user's own function
    state = random_state()
    returned = scope[node.name](dataset, item)
    positions = {(n.lineno, n.col_offset, n.end_lineno, n.end_col_offset): values[key]
                 for key, n in recorder.nodes.items() if key in values}
    images = {position(n) for key, n in recorder.nodes.items() if key in pil}
    made = {position(n) for key, n in recorder.nodes.items() if key in tensors}
    return {"values": positions, "pil": images, "tensors": made, "after": after, "returned": returned,
            "state": state, "item": item}


def position(node: ast.AST) -> tuple:
    return node.lineno, node.col_offset, node.end_lineno, node.end_col_offset


def trace_back(node: ast.FunctionDef, run: dict) -> dict | str:
    """The statement that made the returned image float, its 8-bit source, the conversion over it, and the
    later statements that change the image's values; or why it cannot be traced."""
    image = returned_image(run["returned"])
    if image is None:
        return "returns no float image (an array or a tensor of floats)"
    index, returned = image
    values, after = run["values"], run["after"]
    for k, statement in enumerate(node.body):
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            continue
        target = statement.targets[0].id
        made = after.get(k, {}).get(target)
        if kind(made) != "float" or made.size != returned.size:
            continue
        sources = [n for n in ast.walk(statement.value) if position_of(n) in values
                   and kind(values[position_of(n)]) == "8-bit" and values[position_of(n)].size == returned.size]
        if not sources:
            return f"line {statement.lineno}: the float image is made from no 8-bit image of as many values"
        source = max(sources, key=lambda n: len(ast.unparse(n)))
        conversion, conversions = conversion_over(statement.value, source, values)
        removed, chain, current = [], target, made
        for j, later in enumerate(node.body[k + 1:], start=k + 1):
            if isinstance(later, ast.Return):
                break
            snapshot = after.get(j, {})
            name = later.targets[0].id if isinstance(later, ast.Assign) and len(later.targets) == 1 and \
                isinstance(later.targets[0], ast.Name) else None
            if name and name != chain and kind(snapshot.get(name)) == "float" and \
                    any(isinstance(n, ast.Name) and n.id == chain for n in ast.walk(later.value)):
                chain = name  # the image, under a new name
            now = snapshot.get(chain)
            if now is None:
                continue
            if not (now.shape == current.shape and str(now.dtype) == str(current.dtype) and (now == current).all()) \
                    and not same_values(now, current):
                removed.append(later)  # it changes the image's values: the step's conversion does it
            current = now
        return {"statement": statement, "target": target, "source": source, "conversion": conversion,
                "conversions": conversions, "removed": removed, "run": run, "index": index,
                "pil": position(source) in run["pil"]}
    return "no statement on the function's top level makes the returned float image"


def position_of(node: ast.AST) -> tuple | None:
    return position(node) if hasattr(node, "lineno") else None


def conversion_over(root: ast.AST, source: ast.AST, values: dict) -> tuple[ast.AST, dict[int, ast.AST]]:
    """Over `source`, each step up read as a conversion (its values differ from the step's below) or a layout
    (the same values, moved); returns the topmost conversion's expression and, for each conversion, the
    expression below it that stays in its place."""
    parents = {id(child): parent for parent in ast.walk(root) for child in ast.iter_child_nodes(parent)}
    node, top, conversions = source, source, {}
    while id(node) in parents:
        parent = parents[id(node)]
        while id(parent) in parents and position_of(parent) not in values:  # a keyword, an argument list
            parent = parents[id(parent)]
        below, above = values.get(position_of(node)), values.get(position_of(parent))
        if below is None or above is None:
            break
        if not same_values(below, above):
            conversions[id(parent)] = node
            top = parent
        node = parent
    return top, conversions


class WithoutConversions(ast.NodeTransformer):
    """Each conversion replaced by the expression below it (made a tensor where the conversion made one, its
    channels moved first where the conversion moved them: `to_tensor`); the 8-bit source by its array form."""

    def __init__(self, conversions: dict[int, ast.AST], source: ast.AST, source_code: str, run: dict, torch: str):
        self.conversions, self.source, self.source_code = conversions, source, source_code
        self.run, self.torch = run, torch

    def visit(self, node: ast.AST) -> ast.AST:
        if id(node) not in self.conversions:
            return ast.parse(self.source_code, mode="eval").body if node is self.source else self.generic_visit(node)
        above = node
        while id(node) in self.conversions:
            node = self.conversions[id(node)]
        code = ast.unparse(self.visit(node))
        if position(above) in self.run["tensors"] and position(node) not in self.run["tensors"]:
            code = f"{self.torch}.as_tensor({code})"
        made, kept = self.run["values"][position(above)].shape, self.run["values"][position(node)].shape
        if len(made) == 3 and made != kept and made == (kept[2], kept[0], kept[1]):
            code = f"{code}.permute(2, 0, 1)" if "as_tensor" in code or position(node) in self.run["tensors"] \
                else f"{code}.transpose(2, 0, 1)"
        return ast.parse(code, mode="eval").body


def rebuilt(node: ast.FunctionDef, found: dict, namespace: dict, file: str, first: int) -> tuple[Any, str]:
    """The `__getitem__` with the conversions over the 8-bit source taken out (its layout steps kept) and the
    statements that change the image's values left out; the 8-bit expression that replaces the conversion."""
    source_text = ast.unparse(found["source"])
    numpy = next((k for k, v in namespace.items() if getattr(v, "__name__", None) == "numpy"), None)
    numpy = numpy or "__import__('numpy')"
    # A copy (np.array), not a view: PIL's buffer is read-only, and torch.from_numpy of a read-only array warns
    # that writing to the tensor is undefined behaviour, in the trial and in the user's patched script alike.
    array = source_text if not found["pil"] else f"{numpy}.array({source_text}, dtype={numpy}.uint8)"
    top, conversions = found["conversion"], found["conversions"]
    torch = next((k for k, v in namespace.items() if getattr(v, "__name__", None) == "torch"), "__import__('torch')")
    uint8 = ast.unparse(WithoutConversions(conversions, found["source"], array, found["run"], torch).visit(top))
    statement = found["statement"]
    function = ast.parse(ast.unparse(node)).body[0]
    removed = {ast.unparse(s) for s in found["removed"]}
    conversion = ast.unparse(top)

    class Swap(ast.NodeTransformer):
        def generic_visit(self, n: ast.AST) -> ast.AST:
            if isinstance(n, ast.expr) and ast.unparse(n) == conversion:
                return ast.parse(uint8, mode="eval").body
            return super().generic_visit(n)

    function.body = [Swap().visit(s) if ast.unparse(s) == ast.unparse(statement) else s
                     for s in function.body if ast.unparse(s) not in removed]
    tree = ast.fix_missing_locations(ast.Module([function], []))
    ast.increment_lineno(tree, first - 1)
    scope: dict[str, Any] = {}
    exec(compile(tree, file, "exec"), namespace, scope)  # noqa: S102 - the user's function, rewritten
    return scope[function.name], uint8


def fitted_plan(dataset: Any, node: ast.FunctionDef, namespace: dict, file: str, first: int, runs: list[dict],
                found: dict, saved: tuple) -> BytePlan | str:
    """The plan where the rewritten `__getitem__`'s 8-bit images map to the float ones on every probed item."""
    from advisor.trials.interposition.uint8_fit import fit

    cls = type(dataset)
    line = found["line"]
    where = f"{cls.__name__}.__getitem__ (line {line})"
    try:
        function, uint8 = rebuilt(node, found, namespace, file, first)
    except SyntaxError as exc:
        return f"{where}: the 8-bit form does not compile ({exc.msg})"
    pairs = []
    try:
        for run in runs:
            set_random_state(run["state"])
            got = returned_image_at(function(dataset, run["item"]), found["index"])
            pairs.append((got, returned_image(run["returned"])[1], run["returned"]))
    except Exception as exc:  # noqa: BLE001 - the user's function, rewritten
        return f"{where}: the 8-bit form fails ({type(exc).__name__}: {exc})"
    finally:
        set_random_state(saved)
    for got, wanted, _ in pairs:
        if got is None or str(got.dtype) != "uint8" or got.shape != wanted.shape:
            shape = None if got is None else (tuple(got.shape), str(got.dtype))
            return (f"{where}: without the conversion the image returned is {shape}, not 8-bit in the float "
                    f"image's shape {tuple(wanted.shape)}")
    result = fit([g for g, _, _ in pairs], [w for _, w, _ in pairs])
    if isinstance(result, str):
        return f"{where}: {result}"
    mean, std, dtype = result
    written = " ".join(ast.unparse(s) for s in found["removed"])  # the names the script normalized with, first
    named = [module_name(c, namespace, written) if isinstance(c, list) else (None, None) for c in (mean, std)]
    plan = BytePlan(f"{cls.__module__}.{cls.__qualname__}", file, line, found["index"], 255.0, mean, std,
                    ast.unparse(found["conversion"]), uint8, None,
                    dtypes=(dtype, dtype) if isinstance(mean, list) else (None, None),
                    removed=tuple(ast.unparse(s) for s in found["removed"]),
                    codes=tuple(n[0] for n in named), views=tuple(n[1] for n in named))
    return dataclasses.replace(plan, function=function)


def returned_image_at(value: Any, index: int | None) -> Any:
    """The returned value's image element as an array."""
    element = value if index is None else value[index]
    return as_array(element)


def module_name(values: list, namespace: dict, written: str = "") -> tuple[str | None, list[int] | None]:
    """The module-level constant (array, list, tuple, tensor) that holds the fitted per-channel `values`, so the
    patch writes the script's own name (one the left-out statements name first), and the shape it takes in
    the image's layout; (None, None) if none."""
    import re

    import numpy as np

    wanted = np.ravel(np.asarray(values, dtype=np.float64))
    named = set(re.findall(r"\w+", written))
    for name, value in sorted(namespace.items(), key=lambda item: item[0] not in named):
        if name.startswith("_") or callable(value) or isinstance(value, (str, bytes, bool, int, float)):
            continue
        array = as_array(value) if not isinstance(value, (list, tuple)) else np.asarray(value)
        if array is None or array.dtype.kind not in "fiu" or array.size != wanted.size:
            continue
        if np.allclose(array.astype(np.float64).ravel(), wanted, rtol=0, atol=1e-6):
            shape = list(np.shape(values))
            return name, (shape if list(array.shape) != shape else None)
    return None, None
