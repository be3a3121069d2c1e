"""`prefetch_factor`: how many batches each DataLoader worker loads ahead.

- **In the trial**: the training DataLoader built with this `prefetch_factor` (the batches each worker loads
  ahead).
- **Proposed when**: the search does not propose it; `--try prefetch_factor=4` measures it like any change.
- **Not applicable**: a loader with no workers.
- **The patch writes**: `prefetch_factor=N` in the DataLoader (`prefetch_factor=4 if args.num_workers > 0
  else None` where the worker count is only known at run time).
"""

from advisor.knobs.knob import AT_LOADER, COUNT, IN_LOADER, LOADER, NEEDS_A_VALUE, Knob, Written
from advisor.knobs.in_trial import with_workers

KNOB = Knob("prefetch_factor", COUNT, LOADER, AT_LOADER, "the prefetch depth", alone=NEEDS_A_VALUE, on_surface=False,
            needs_workers=True, numerics=False, training_argument="dataloader_prefetch_factor",
            written=Written(IN_LOADER), in_loader=with_workers)
