"""`ddp_find_unused_parameters`: DistributedDataParallel's `find_unused_parameters`, on every rank.

- Applied and written as [`ddp_bucket_cap_mb`](#advisor.knobs.ddp_bucket_cap_mb) is, where the user's script
  or `--try` asks for it.
"""

from advisor.knobs.knob import AT_DDP, DDP, FLAG, IN_DDP, Knob, Written

KNOB = Knob("ddp_find_unused_parameters", FLAG, DDP, AT_DDP, "DDP unused-parameter search", on_surface=False,
            written=Written(IN_DDP, argument="find_unused_parameters"))
