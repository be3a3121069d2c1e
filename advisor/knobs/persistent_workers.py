"""`persistent_workers`: the training DataLoader's workers kept alive across epochs.

- **In the trial**: the training DataLoader built with `persistent_workers=True`, so that its workers live
  across epochs. It goes with [`num_workers`](#advisor.knobs.num_workers): the search sets it with every
  worker count it tries, and never turns it alone (`--only`, `--skip` and `--try` do not take it).
- **Not applicable**: a loader with no workers.
- **The patch writes**: `persistent_workers=True` beside the workers (`persistent_workers=args.num_workers >
  0` where the count is only known at run time).
"""

from advisor.knobs.knob import AT_LOADER, FLAG, IN_LOADER, LOADER, Knob, Written
from advisor.knobs.in_trial import with_workers

KNOB = Knob("persistent_workers", FLAG, LOADER, AT_LOADER, "persistent workers", on_surface=False,
            companion_of=("num_workers", True), needs_workers=True, without_workers=False, numerics=False,
            training_argument="dataloader_persistent_workers", written=Written(IN_LOADER), in_loader=with_workers)
