"""Which names hold a model, and whether its layers include BatchNorm."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from advisor.code.lint.names import BATCHNORM_MODELS, BATCHNORM_NAMES
from advisor.code.lint.ast_nodes import dotted, last_part

if TYPE_CHECKING:  # the script builds its parts: they see it, it imports them
    from advisor.code.lint.script import Script


class Models:
    """Names bound to a model (an nn.Module subclass of the script, torchvision, nn.*), and whether the
    script's models have BatchNorm layers."""

    def __init__(self, script: Script):
        self.script = script
        self.module_classes = {
            n.name
            for n in ast.walk(script.tree)
            if isinstance(n, ast.ClassDef) and any(last_part(script.resolve(b)) == "Module" for b in n.bases)
        }
        self.names = self._model_names()

    def _model_names(self) -> set[str]:
        """Names (last part) bound to a model: an nn.Module subclass of the script, torchvision, nn.*."""
        names = {"model", "net", "network"}
        for node in ast.walk(self.script.tree):
            if isinstance(node, ast.Assign) and self.is_model_expr(node.value, self.module_classes):
                for target in node.targets:
                    if isinstance(target, (ast.Name, ast.Attribute)):
                        names.add(last_part(dotted(target)))
        return names

    def is_model_expr(self, node: ast.AST, module_classes: set[str] | None = None) -> bool:
        """A model constructor call, possibly chained: `Net().cuda()`, `torchvision.models.resnet18()`."""
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(
            node.func.value, ast.Call
        ):
            node = node.func.value  # Net().to(device).half() → Net()
        if not isinstance(node, ast.Call):
            return False
        resolved = self.script.resolve(node.func) or ""
        if module_classes and resolved in module_classes:
            return True
        last = last_part(resolved)
        if resolved.startswith("torch.nn.") and not resolved.startswith("torch.nn.functional."):
            # Layer classes (nn.Sequential, nn.Conv2d), not losses, parameters or helper functions.
            return last[:1].isupper() and not last.endswith("Loss") and last != "Parameter"
        return resolved.startswith(("torchvision.models.", "timm.create_model")) or (
            resolved.startswith("models.") and "torchvision.models" in self.script.aliases.values()
        )

    def is_model(self, node: ast.AST) -> bool:
        """True if `node` is a model: a known model name, or a model constructor call (`model.cuda()` too)."""
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in {
            "to", "cuda", "cpu", "float", "half", "train", "eval", "requires_grad_",
        }:
            node = node.func.value  # model.cuda().half(): look at `model`
        if isinstance(node, (ast.Name, ast.Attribute)):
            return last_part(dotted(node)) in self.names
        return self.is_model_expr(node, self.module_classes)

    def uses_batchnorm(self) -> bool:
        """True if the script builds BatchNorm layers itself or a torchvision model that has them."""
        for node in ast.walk(self.script.tree):
            if isinstance(node, ast.Name):
                name = node.id
            elif isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                name = node.value  # torch.hub.load("pytorch/vision", "resnet50"), timm names
            else:
                continue
            if BATCHNORM_NAMES.match(name) or BATCHNORM_MODELS.match(name):
                return True
        return False

    def keeps_batchnorm_fp32(self) -> bool:
        """True if the script puts BatchNorm back in fp32: `if isinstance(m, nn.BatchNorm2d): m.float()`."""
        for node in ast.walk(self.script.tree):
            if not isinstance(node, ast.If):
                continue
            names = [getattr(n, "attr", None) or getattr(n, "id", "") for n in ast.walk(node.test)]
            if any(BATCHNORM_NAMES.match(name) for name in names) and any(
                isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "float"
                for sub in ast.walk(node)
            ):
                return True
        return False
