"""DistributedDataParallel's own arguments as knobs (`bucket_cap_mb`, `gradient_as_bucket_view`, `static_graph`,
`find_unused_parameters`): its `__init__` is wrapped inside each rank, the user's values recorded, the
requested ones set.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from advisor.knobs import BY_NAME, DDP_KNOBS
from advisor.trials.knobs import APPLIED, Knobs, not_applicable


class DDPKnobs:
    """Wraps DistributedDataParallel.__init__: the DDP knobs set, the user's values and the outcomes kept."""

    ARGUMENTS = {name: BY_NAME[name].written.argument for name in DDP_KNOBS}  # knob -> DDP's keyword

    def __init__(self, knobs: Knobs):
        self.knobs = knobs
        self.user: dict[str, Any] = {}
        self.wrapped = 0

    def install(self) -> Callable[[], None]:
        """Wrap the constructor; returns an undo."""
        from torch.nn.parallel import DistributedDataParallel

        original = DistributedDataParallel.__init__
        signature = inspect.signature(original)
        interposition = self

        def __init__(ddp, *args, **kwargs):  # noqa: N807
            bound = signature.bind(ddp, *args, **kwargs)
            bound.apply_defaults()
            values = bound.arguments
            if not interposition.wrapped:  # the first model wrapped is the one trained
                interposition.user = {knob: values.get(name) for knob, name in interposition.ARGUMENTS.items()}
            interposition.wrapped += 1
            for knob, name in interposition.ARGUMENTS.items():
                value = getattr(interposition.knobs, knob)
                if value is not None and name in values:
                    values[name] = value
            return original(*bound.args, **bound.kwargs)

        DistributedDataParallel.__init__ = __init__

        def undo() -> None:
            DistributedDataParallel.__init__ = original

        return undo

    def outcomes(self) -> dict[str, str]:
        """Each requested DDP knob: applied, or why not."""
        requested = [k for k in DDP_KNOBS if getattr(self.knobs, k) is not None]
        if self.wrapped:
            return {k: APPLIED for k in requested}
        return {k: not_applicable("the script wraps no model in DistributedDataParallel") for k in requested}
