"""`ddp_gradient_as_bucket_view`: DistributedDataParallel's `gradient_as_bucket_view`, on every rank.

- Applied, proposed and written as [`ddp_bucket_cap_mb`](#advisor.knobs.ddp_bucket_cap_mb) is: gradients kept as views
  into the all-reduce buckets, one copy fewer.
"""

from advisor.knobs.knob import AT_DDP, DDP, FLAG, IN_DDP, Knob, Written

KNOB = Knob("ddp_gradient_as_bucket_view", FLAG, DDP, AT_DDP, "DDP bucket views", on_surface=False,
            written=Written(IN_DDP, argument="gradient_as_bucket_view"))
