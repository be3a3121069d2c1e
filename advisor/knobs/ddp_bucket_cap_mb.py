"""`ddp_bucket_cap_mb`: DistributedDataParallel's gradient bucket size (`bucket_cap_mb`), on every rank.

- **In the trial**: DistributedDataParallel's own arguments, applied on every rank alike
  ([Data-parallel jobs](distributed.md)).
- **Proposed when**: without a straggler, exposed all-reduce binds the job.
- **Not applicable**: a trial that is not data-parallel.
- **The patch writes**: the arguments in the `DistributedDataParallel(...)` call.
"""

from advisor.knobs.knob import AT_DDP, COUNT, DDP, IN_DDP, NEEDS_A_VALUE, Knob, Written

KNOB = Knob("ddp_bucket_cap_mb", COUNT, DDP, AT_DDP, "DDP bucket size", alone=NEEDS_A_VALUE, on_surface=False,
            proposed_as="ddp-buckets", spread=(0.10, None), written=Written(IN_DDP, argument="bucket_cap_mb"))
