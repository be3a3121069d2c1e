"""`ddp_static_graph`: DistributedDataParallel's `static_graph`, on every rank.

- Applied and written as [`ddp_bucket_cap_mb`](#advisor.knobs.ddp_bucket_cap_mb) is, where the user's script
  or `--try` asks for it.
"""

from advisor.knobs.knob import AT_DDP, DDP, FLAG, IN_DDP, Knob, Written

KNOB = Knob("ddp_static_graph", FLAG, DDP, AT_DDP, "DDP static graph", on_surface=False,
            written=Written(IN_DDP, argument="static_graph"))
