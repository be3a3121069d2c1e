"""`ddp_gradient_as_bucket_view`: DistributedDataParallel's `gradient_as_bucket_view`, on every rank.

- Applied, proposed and written as [`ddp_bucket_cap_mb`](#advisor.knobs.ddp_bucket_cap_mb) is: gradients kept as views
  into the all-reduce buckets, one copy fewer.
"""

from __future__ import annotations

from advisor.knobs.knob import AT_DDP, DDP, FLAG, IN_DDP, Knob, Written
from advisor.knobs.offer import ROUND_GAIN, Best, Offer


def offer(best: Best) -> Offer | None:
    """DistributedDataParallel's own arguments, in a data-parallel session: those the rules chose for exposed
    all-reduce (bucket size, bucket views, no search for unused parameters), else bucket views alone as part of a
    round over the knobs."""
    if best.ranks <= 1:
        return None
    advice = best.advice.get("ddp-buckets")
    wanted = dict(advice.knobs) if advice is not None else {"ddp_gradient_as_bucket_view": True}
    wanted = {k: v for k, v in wanted.items() if getattr(best.knobs, k) != v}
    if not wanted:
        return None
    gain = advice.predicted_gain if advice is not None else (0.05 if best.bound == "communication" else ROUND_GAIN)
    change = "DDP " + ", ".join(f"{k.removeprefix('ddp_')}={v}" for k, v in wanted.items())
    slug = "-".join(k.removeprefix("ddp_").replace("_", "-") + ("" if v is True else f"-{v}".lower())
                    for k, v in wanted.items())
    return Offer(wanted, change, f"ddp-{slug}", gain, "communication", predicted=advice is not None,
                 recommendation="ddp-buckets")


KNOB = Knob("ddp_gradient_as_bucket_view", FLAG, DDP, AT_DDP, "DDP bucket views", on_surface=False,
            written=Written(IN_DDP, argument="gradient_as_bucket_view"), offer=offer, proposed_as="ddp-buckets",
            advised=lambda figures: True)
