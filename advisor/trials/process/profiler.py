"""torch.profiler as a trial starts it, without the import of torch._inductor that its start makes.

`torch.profiler.profile.prepare_trace` asks `hasattr(torch, "_inductor")` to read inductor's CUDA graphs
setting, and torch imports `torch._inductor` (with `torch._dynamo`) lazily on that question: 1.0-1.4 s
here, in every profiled trial that does not compile, about a third of a short CPU trial. Where inductor
was not imported, nothing compiled with it and the answer is False; where it was, the question is asked
as torch asks it.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator


@contextlib.contextmanager
def inductor_not_imported_on_demand(torch: Any) -> Iterator[None]:
    """Within: `torch._inductor` is not imported by an attribute lookup, unless it already was."""
    lazy = getattr(torch, "_lazy_modules", None)
    if "torch._inductor" in sys.modules or not isinstance(lazy, set) or "_inductor" not in lazy:
        yield
        return
    lazy.discard("_inductor")
    try:
        yield
    finally:
        lazy.add("_inductor")


def profile(**kwargs: Any) -> Any:
    """A `torch.profiler.profile(**kwargs)` whose start does not import torch._inductor."""
    import torch

    class Profile(torch.profiler.profile):
        def prepare_trace(self) -> None:
            with inductor_not_imported_on_demand(torch):
                super().prepare_trace()

    return Profile(**kwargs)
