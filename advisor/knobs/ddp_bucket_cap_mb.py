"""`ddp_bucket_cap_mb`: DistributedDataParallel's gradient bucket size (`bucket_cap_mb`), on every rank.

- **In the trial**: DistributedDataParallel's own arguments, applied on every rank alike
  ([Data-parallel jobs](distributed.md)).
- **Proposed when**: without a straggler, exposed all-reduce binds the job.
- **Not applicable**: a trial that is not data-parallel.
- **The patch writes**: the arguments in the `DistributedDataParallel(...)` call.
"""

from typing import Any

from advisor.knobs.knob import AT_DDP, COUNT, DDP, IN_DDP, NEEDS_A_VALUE, Knob, Written

SMALL_COLLECTIVE = 4 * 2**20  # bytes: collectives smaller than this pay more in latency than in bandwidth


def advised(figures: dict[str, Any]) -> int:
    """The bucket for exposed all-reduce: many small all-reduces pay latency each (larger buckets, 100 MB); few
    large ones start late (smaller buckets, 10 MB)."""
    count, total = figures["all_reduces"], figures["all_reduce_bytes"]
    return 100 if count > 4 and total and total / count < SMALL_COLLECTIVE else 10


KNOB = Knob("ddp_bucket_cap_mb", COUNT, DDP, AT_DDP, "DDP bucket size", alone=NEEDS_A_VALUE, on_surface=False,
            proposed_as="ddp-buckets", spread=(0.10, None), written=Written(IN_DDP, argument="bucket_cap_mb"),
            advised=advised)
