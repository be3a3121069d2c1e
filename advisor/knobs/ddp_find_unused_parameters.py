"""`ddp_find_unused_parameters`: DistributedDataParallel's `find_unused_parameters`, on every rank.

- Applied and written as [`ddp_bucket_cap_mb`](#advisor.knobs.ddp_bucket_cap_mb) is, where the user's script
  or `--try` asks for it; turned off in the change for exposed all-reduce where the script passes
  `find_unused_parameters=True`.
"""

from __future__ import annotations

from typing import Any

from advisor.knobs.knob import AT_DDP, DDP, FLAG, IN_DDP, Knob, Written


def advised(figures: dict[str, Any]) -> bool | None:
    """Off, in the change for exposed all-reduce, where the script turns it on; else left as it is."""
    return False if figures["user_values"].get(KNOB.name) else None


KNOB = Knob("ddp_find_unused_parameters", FLAG, DDP, AT_DDP, "DDP unused-parameter search", on_surface=False,
            written=Written(IN_DDP, argument="find_unused_parameters"), proposed_as="ddp-buckets", advised=advised,
            advised_because="the script passes find_unused_parameters=True: DDP then walks the autograd graph every "
                            "step and can start no all-reduce before the backward ends")
