"""`batch_size`: the training DataLoader's batch size.

- **In the trial**: the training DataLoader's batch size.
- **Proposed when**: launches bind (a larger batch), only with evidence (low utilization and measured
  headroom, or a launch-bound step). It grows only while a memory model (peak memory against batch size,
  fitted from the trials) predicts it fits under 85% of device memory; after an out-of-memory it bisects.
  As the last resort of an out-of-memory baseline, a smaller batch, said plainly.
- **Not applicable**: `--keep-effective-batch`; a script with no batch argument (measured in steps/s).
- **The patch writes**: where the batch size is set, with a note to scale the learning rate.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from advisor.knobs.graph import StepGraph, TrialSettings
from advisor.knobs.knob import AT_LOADER, COUNT, IN_LOADER, LOADER, NEEDS_A_VALUE, Knob, WhatIf, Written

def setting(trial: TrialSettings) -> int:
    """The batch the trial's loader was built with, else the one its summary names."""
    return int(trial.value("batch_size", (trial.record.get("summary") or {}).get("batch_size") or 1))


def transform(g: StepGraph, value: Any, p: float, params: dict[str, float]) -> StepGraph:
    """Per step, the loader's batch, the kernels and the copies × (B'/B)^γ (γ = p); launches and Python fixed."""
    k = (int(value) / g.batch) ** p
    return dataclasses.replace(g, batch=int(value), produce_s=g.produce_s * k, device_s=g.device_s * k,
                               matmul_s=g.matmul_s * k, matmul_tc_s=g.matmul_tc_s * k, copy_s=g.copy_s * k,
                               layout_s=g.layout_s * k, nchw_s=g.nchw_s * k, conv_s=g.conv_s * k,
                               batch_bytes=g.batch_bytes * int(value) / g.batch)


def family(g: StepGraph) -> str:
    """γ of the graph's precision and loader."""
    return ("batch_16" if g.amp else "batch") + ("_inline" if g.workers == 0 else "")


# γ (1: time per sample constant), one per precision and per loader: a batch measured in fp32 does not stand for
# 16 bits (a working set and units of their own: on the recorded CPU conv surface 32→64 lost 25% in fp32, nothing
# in bf16), nor one measured with the training thread loading its own batches for worker processes (on the
# recorded H100 steady surface 32→64 gained 30% with no workers, 5% less on average with them).
WHAT_IF = WhatIf("batch_size", "batch", setting, transform, "batch", prior=1.0, bounds=(0.3, 1.5),
                 families=("batch", "batch_16", "batch_inline", "batch_16_inline"), family_for=family)


KNOB = Knob("batch_size", COUNT, LOADER, AT_LOADER, "the batch size", alone=NEEDS_A_VALUE,
            training_argument="per_device_train_batch_size", proposed_as="larger-batch", spread=(0.10, 0.10),
            whatif=WHAT_IF, written=Written(IN_LOADER, position=1, excluded_by="batch_sampler"),
            moved=lambda v: f"batch →{v}")
