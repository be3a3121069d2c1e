"""torch.profiler as a trial starts it, without the import of torch._inductor that its start makes.

`torch.profiler.profile.prepare_trace` asks `hasattr(torch, "_inductor")` to read inductor's CUDA graphs
setting, and torch imports `torch._inductor` (with `torch._dynamo`) lazily on that question: 1.0-1.4 s
here, in every profiled trial that does not compile, about a third of a short CPU trial. Where inductor
was not imported, nothing compiled with it and the answer is False; where it was, the question is asked
as torch asks it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
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


def give_back_trace_memory() -> None:
    """Once a stopped profiler is dropped: free what its trace held and have glibc return the freed pages.

    Its events are many small blocks amid the heap, which glibc keeps after they are freed: without the trim a
    trial ran its remaining steps (the windows, the rest of a step whose trace was cut) with the trace's memory
    still resident, some 2.5 kB an operator recorded (measured on torch 2.14: 146 MB after a trace of 59 000
    operators was written and dropped, none after the trim)."""
    gc.collect()  # the profiler's objects may sit in reference cycles
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        pass
