"""`batch_size`: the training DataLoader's batch size.

- **In the trial**: the training DataLoader's batch size.
- **Proposed when**: launches bind (a larger batch), only with evidence (low utilization and measured
  headroom, or a launch-bound step). It grows only while a memory model (peak memory against batch size,
  fitted from the trials) predicts it fits under 85% of device memory; after an out-of-memory it bisects.
  As the last resort of an out-of-memory baseline, a smaller batch, said plainly.
- **Not applicable**: `--keep-effective-batch`; a script with no batch argument (measured in steps/s).
- **The patch writes**: where the batch size is set, with a note to scale the learning rate.
"""

from advisor.knobs.knob import AT_LOADER, COUNT, LOADER, NEEDS_A_VALUE, Knob

KNOB = Knob("batch_size", COUNT, LOADER, AT_LOADER, "the batch size", alone=NEEDS_A_VALUE,
            training_argument="per_device_train_batch_size")
